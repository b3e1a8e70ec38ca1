"""One draft session on the drafter: what the target confirmed, what the drafter predicts after it,
and what to send next.

The drafter keeps a *path*: its own draft tokens for indices k, k+1, ... after the confirmed
context. For the message at k it sends an **answer**, path[0:γ] with start k and an empty basis.
With overlap on it then drafts on while the target verifies: it assumes the answer is accepted, takes
its own Gumbel-coupled token at k+γ as the predicted bonus (under GUMBEL the target's bonus is its
own noisy argmax at k+γ with the same seed, so an honest drafter predicts it as well as any token),
and sends an **early draft**: path[γ+1:2γ+1] with start k+γ+1 and basis path[0:γ+1].

When the next ``advance`` comes, the path is trimmed if the emitted tokens are a prefix of it, and
dropped otherwise; a drop sets the cancel flag, so a block still being drafted for the dropped path
stops at the next token boundary. If the target's rule (start == k, basis == the emitted tokens)
says the early draft already sent is usable at the new k, it is that round's answer and no other is
sent; the drafter goes straight on to the next early draft.

State changes happen on the trio thread; only ``draft_tokens`` runs in a worker thread, and only one
at a time per session, so the session's KV cache has one user.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import trio

from node.drafter.strategies import Behaviour
from p2p.messages import MAX_DRAFT_MS, Advance, Draft
from verifier.decode import Proposer
from verifier.errors import SpecmarketError
from verifier.params import SamplingParams

MS = 1000.0


class ProtocolViolation(SpecmarketError):
    """The target sent a message that does not fit the session (e.g. a k that skips tokens)."""


class Kind(enum.Enum):
    ANSWER = "answer"  # for the confirmed k, basis ()
    EARLY = "early"  # for k + γ + 1, assuming the answer and the predicted bonus are emitted


@dataclass(frozen=True)
class Step:
    kind: Kind
    need: int  # path tokens (from k) the draft needs


@dataclass
class DraftSession:
    """Drafter-side state of one job."""

    job: str
    context: list[int]  # prompt + every token the target has confirmed
    params: SamplingParams
    seed: int
    gamma: int
    k: int
    proposer: Proposer
    behaviour: Behaviour
    max_positions: int  # of the draft model: the path never outgrows it
    overlap: bool = True
    path: list[int] = field(default_factory=list)  # own draft tokens for k, k+1, ...
    epoch: int = 0  # bumped when the path is dropped: an extension still in flight is then discarded
    cancel: threading.Event = field(default_factory=threading.Event)  # set on a drop: stop drafting for it
    answered: int = -1  # the k whose answer the target has (ours, or our early draft for it)
    early: tuple[int, tuple[int, ...]] | None = None  # (start, basis) of the newest early draft sent
    asked_at: float = 0.0  # when the message for k arrived
    answered_at: float = 0.0  # when the answer for k went out (the early draft's work starts there)
    short_at: int = -1  # the k at which the proposer gave fewer tokens than asked: send what there is
    changed: trio.Event = field(default_factory=trio.Event)
    drafts_sent: int = 0
    rounds: int = 1  # rounds the target asked for: the open, then one per advance
    tokens_sent: int = 0  # draft tokens sent (answers and early drafts), for the session's last log line
    garbage_index: int = 0

    # -- trio thread ---------------------------------------------------------------------------
    def advance(self, msg: Advance, now: float) -> None:
        if msg.job != self.job:
            raise ProtocolViolation(f"advance for job {msg.job!r} on the stream of job {self.job!r}")
        if msg.start != self.k + len(msg.tokens):
            raise ProtocolViolation(f"advance to k={msg.start} from k={self.k} with {len(msg.tokens)} tokens")
        emitted = list(msg.tokens)
        self.rounds += 1
        self.context.extend(emitted)
        self.k, self.asked_at = msg.start, now
        if len(emitted) <= len(self.path) and self.path[: len(emitted)] == emitted:
            del self.path[: len(emitted)]  # as predicted: the rest of the path still holds
        else:
            self.drop_path()
        if self.early is not None and self.early[0] <= self.k:
            start, basis = self.early  # the target judges it at this round (or has dropped it): one look
            self.early = None
            if start == self.k and tuple(self.context[len(self.context) - len(basis) :]) == basis:
                self.answered, self.answered_at = self.k, now  # the target's own rule: it is this round's answer
        self.changed.set()

    def drop_path(self) -> None:
        self.path.clear()
        self.epoch += 1
        self.cancel.set()
        self.cancel = threading.Event()

    def stop(self) -> None:
        """The session ends: a block being drafted stops at its next token."""
        self.cancel.set()

    def next_step(self) -> Step | None:
        """What to draft and send next; None: nothing until the next advance."""
        room = self.max_positions - len(self.context)  # path tokens the draft model has positions for
        if self.short_at == self.k:
            room = min(room, len(self.path))
        if self.answered != self.k:
            return Step(Kind.ANSWER, max(0, min(self.gamma, room)))
        early_start = self.k + self.gamma + 1
        if not self.overlap or (self.early is not None and self.early[0] == early_start):
            return None
        need = min(2 * self.gamma + 1, room)
        return Step(Kind.EARLY, need) if need > self.gamma + 1 else None

    def draft_for(self, step: Step) -> tuple[Draft, float]:
        """The draft ``step`` sends (draft_ms still 0), and since when the drafter has been at it."""
        g = self.gamma
        if step.kind is Kind.ANSWER:
            return Draft(self.job, self.k, tuple(self.path[:g])), self.asked_at
        basis, tokens = tuple(self.path[: g + 1]), tuple(self.path[g + 1 : 2 * g + 1])
        return Draft(self.job, self.k + g + 1, tokens, basis), self.answered_at

    def mark_sent(self, draft: Draft, since: float, now: float) -> Draft:
        """Record a draft about to go out (before the send, so an advance read meanwhile sees it) and
        stamp it with the drafter's time on it."""
        self.drafts_sent += 1
        if draft.basis:
            self.early = (draft.start, draft.basis)
        elif draft.start == self.k:
            self.answered, self.answered_at = self.k, now
        return replace(draft, draft_ms=round(min(max(now - since, 0.0) * MS, MAX_DRAFT_MS), 3))

    def extension(self, need: int) -> tuple[list[int], int, int]:
        """What ``draft_tokens`` needs to grow the path to ``need``: (context + path, k of the next, count)."""
        return [*self.context, *self.path], self.k + len(self.path), need - len(self.path)

    def extended(self, epoch: int, tokens: list[int], asked: int, cancel: threading.Event) -> None:
        """An extension came back; it is discarded if the path it grew was dropped meanwhile."""
        if epoch != self.epoch:
            return
        self.path.extend(tokens)  # a consistent advance meanwhile only trimmed the path's front
        if len(tokens) < asked and not cancel.is_set():
            self.short_at = self.k

    # -- worker thread -------------------------------------------------------------------------
    def draft_tokens(self, context: Sequence[int], start: int, n: int, cancel: threading.Event) -> list[int]:
        """Up to ``n`` draft tokens after ``context`` (k of the first: ``start``), one proposer call
        per token, stopping at the first token boundary after ``cancel`` is set."""
        out: list[int] = []
        while len(out) < n and not cancel.is_set():
            proposal = self.proposer.propose(
                [*context, *out], start=start + len(out), gamma=1, params=self.params, seed=self.seed
            )
            tokens = getattr(proposal, "tokens", ())
            if not tokens:
                break
            out.append(int(tokens[0]))
        return out
