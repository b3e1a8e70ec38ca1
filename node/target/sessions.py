"""A job's draft sessions as the target sees them: one stream per (job, drafter), the state of the
round in flight, and when a draft is usable for it (node.target.rounds drives them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from p2p.framing import FrameStream
from p2p.messages import Draft
from verifier.tree import EMPTY_TREE, DraftTree

MAX_DRAFTS_PER_MESSAGE = 2  # an answer and one early draft per open/advance; more is flooding


@dataclass
class RemoteSession:
    """One (job, drafter) stream as the target sees it."""

    peer_id: str
    fs: FrameStream
    synced: int = 0  # context tokens the drafter has been sent
    alive: bool = True
    misses: int = 0
    sent_at: float = 0.0
    pending: tuple[Draft, float | None] | None = None  # draft for the current round, latency in s (None: early)
    early: Draft | None = None  # the newest early draft for a later round, judged when its round comes
    messages: int = 0  # open/advance messages sent (counted before each send)
    received: int = 0  # drafts received: more than MAX_DRAFTS_PER_MESSAGE per message is flooding
    accepted: int = 0  # this job: tokens of this drafter's verified drafts that were accepted
    proposed: int = 0  # this job: draft tokens received in time
    payout: str | None = None  # where the drafter asked to be paid (its ``payout`` message), checksummed
    reason: str = ""

    def kill(self, reason: str) -> None:
        if self.alive:
            self.alive, self.reason = False, reason


@dataclass
class RoundState:
    k: int = -1  # k of the round in flight
    context: Sequence[int] = ()  # prompt + the tokens emitted before k, when the round was asked for
    gamma: int = 0  # the round's γ: what each drafter could have proposed
    chosen: str | None = None  # peer whose draft was verified in the round in flight
    chosen_draft: tuple[Draft, float | None] | None = None  # ... its draft and latency (None: early)
    accepted: int = 0  # ... of whose tokens were accepted (known when the round settles)
    tree: DraftTree = EMPTY_TREE  # what the round verified: every drafter's draft merged (or the chosen one)
    wait_s: float = 0.0  # the decode loop's wait in this round
    ends: float = 0.0  # trio time of the round's deadline (drafts of peers on probation may come until then)
    probation: bool = False  # every drafter asked was on probation: nothing to verify, the target decoded alone
    closed: bool = False  # the draft was chosen; later arrivals are misses (deadline) or late (early close)
    changed: trio.Event = field(default_factory=trio.Event)


def usable(draft: Draft, k: int, context: Sequence[int]) -> bool:
    """A draft is usable for the round at k iff it starts at k and its basis is what was emitted at
    k-len(basis) .. k-1, the last tokens of ``context`` (the emitted tokens never reach into the
    prompt: the wire format requires start - len(basis) >= 0)."""
    n = len(draft.basis)
    return draft.start == k and n <= k and tuple(context[len(context) - n :]) == draft.basis
