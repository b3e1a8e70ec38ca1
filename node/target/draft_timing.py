"""Per-job drafting timings on the target: what a round waited, what a draft round trip cost and how
much of it was the drafter's own time, and how often an early draft saved the wait.

The drafter's ``draft_ms`` is its own, untrusted account of its time on a draft. It is used for one
thing: to split a measured round trip into the drafter's share and the rest ("transport": framing,
the network, both event loops). It is clamped to the round trip, so a lie can only move time between
the two shares of this report; it never reaches the market policy, which uses measured times only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from p2p.messages import Draft

if TYPE_CHECKING:
    from node.target.sessions import RoundState

MS = 1000.0
MAX_ROUND_RECORDS = 4096  # per job: a job longer than this keeps its first rounds' records only


@dataclass(frozen=True)
class RoundRecord:
    """One draft round of a job, as the demo's report tabulates it.

    ``kind``: "early" (an early draft was there, usable, when the round came), "answer" (the round
    waited for a drafter's answer), "alone" (no usable draft: the target decoded one token), or
    "probation" (every drafter asked was on probation, ``market.policy``: its draft, if any, was only
    measured; the target decoded one token)."""

    k: int
    kind: str
    drafted: int  # draft tokens verified (a tree's nodes: every answer and the lookup branch, merged)
    accepted: int  # ... of which accepted (the round emitted accepted + 1 tokens)
    wait_ms: float  # the decode loop's wait in the round (send, then drafts)
    draft_ms: float  # the chosen answer's drafter-reported time, clamped to its round trip (0: early/alone)
    transport_ms: float  # the rest of that answer's round trip: framing, network, both event loops
    verify_ms: float  # the target pass that verified the round

    @classmethod
    def of(cls, r: RoundState, verify_s: float) -> RoundRecord:
        """A settled round: its draft's share of the wait, and the pass that verified it."""
        draft, latency = r.chosen_draft if r.chosen is not None and r.chosen_draft else (None, None)
        early = draft is not None and (latency is None or bool(draft.basis))  # as DraftTiming counts early hits
        if early:
            latency = None  # an early draft's time on the drafter is no round trip of this round's message
        draft_s = min(draft.draft_ms / MS, latency) if draft is not None and latency is not None else 0.0
        return cls(
            k=r.k,
            kind=("probation" if r.probation else "alone") if draft is None else "early" if early else "answer",
            drafted=len(r.tree.tokens),
            accepted=r.accepted,
            wait_ms=round(MS * r.wait_s, 3),
            draft_ms=round(MS * draft_s, 3),
            transport_ms=round(MS * (latency - draft_s), 3) if latency is not None else 0.0,
            verify_ms=round(MS * verify_s, 3),
        )

    def to_json(self) -> dict[str, float | int | str]:
        return asdict(self)


@dataclass
class DraftTiming:
    answers: int = 0  # in-time answers to the round's own open/advance (basis ())
    round_trip_s: float = 0.0  # their round trips, send of the message -> arrival of the answer
    reported_s: float = 0.0  # the drafters' draft_ms for them, each clamped to its round trip
    early_hits: int = 0  # early drafts usable at their round
    early_ready: int = 0  # ... of which were there before the round asked (the round did not wait for them)
    stale: int = 0  # early drafts never usable: wrong basis, their round skipped, or replaced by a newer one
    max_wait_s: float = 0.0  # the longest wait of one round (it never exceeds the deadline by more than a send)

    def arrived(self, draft: Draft, latency_s: float | None) -> None:
        """A usable draft for the round in flight; ``latency_s`` None: it was in the early slot."""
        if latency_s is None or draft.basis:
            self.early_hits += 1
            self.early_ready += latency_s is None
            return
        self.answers += 1
        self.round_trip_s += latency_s
        self.reported_s += min(draft.draft_ms / MS, latency_s)

    def waited(self, seconds: float) -> None:
        self.max_wait_s = max(self.max_wait_s, seconds)

    def stats(self) -> dict[str, float | int]:
        n = self.answers
        transport_s = self.round_trip_s - self.reported_s
        return {
            "draft_answers": n,
            "draft_round_trip_ms_per_answer": round(MS * self.round_trip_s / n, 3) if n else 0.0,
            "draft_reported_ms_per_answer": round(MS * self.reported_s / n, 3) if n else 0.0,
            "draft_transport_ms_per_answer": round(MS * transport_s / n, 3) if n else 0.0,
            "draft_transport_seconds": round(transport_s, 4),
            "draft_early_hits": self.early_hits,
            "draft_early_ready": self.early_ready,
            "draft_early_stale": self.stale,
            "draft_wait_ms_max": round(MS * self.max_wait_s, 3),
        }
