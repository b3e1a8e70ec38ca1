"""One draft session on the drafter: what the target confirmed, what the drafter predicts after it,
and what to send next.

The drafter keeps a *path*: its own draft tokens for indices k, k+1, ... after the confirmed
context, each with the draft's probability of it. For the message at k it sends an **answer**, the
first *block* of the path (path[0:n], start k, an empty basis). With overlap on it then drafts on
while the target verifies: it assumes the answer is accepted, takes its own Gumbel-coupled token at
k+n as the predicted bonus (under GUMBEL the target's bonus is its own noisy argmax at k+n with the
same seed, so an honest drafter predicts it as well as any token), and sends an **early draft**: the
next block, start k+n+1 and basis path[0:n+1].

A block is γ tokens (the target's γ: the most a round verifies) or, with ``min_confidence`` set,
ends early at the first token the draft gives a probability below it, that token included: the
dynamic draft length of HF transformers' assisted generation (``assistant_confidence_threshold``).
Where the draft is sure, rounds are long; where it is not, the round is short and its answer comes
sooner, so a token the target will likely reject costs neither draft time nor verification rows.

When the next ``advance`` comes, the path is trimmed if the emitted tokens are a prefix of it, and
dropped otherwise; a drop sets the cancel flag, so a block still being drafted for the dropped path
stops at the next token boundary. If the target's rule (start == k, basis == the emitted tokens)
says the early draft already sent is usable at the new k, it is that round's answer and no other is
sent; the drafter goes straight on to the next early draft.

**Answers in time.** The target waits ``deadline`` (its open says how long) for an answer to an
advance; a later one misses its round, and misses in a row bench the drafter. So an answer to an
advance is drafted against a clock: no token is started that would end past ``ANSWER_SHARE`` of the
deadline after the advance arrived (the rest is left for the link: the target's clock started when it
sent the advance; a drafter far from its target, such as a client drafting for itself across a slow
link, leaves its link's whole round trip, ``link_rtt_s``, where that is longer), and the answer goes
out with the tokens it has, none if need be: an empty answer still tells the target at once that it
decodes this round alone. An advance also *interrupts* an extension in flight at the next token
boundary (its tokens are kept where the advance agrees with them), so the answer to it never waits
for the end of an early block drafted for the round before.

State changes happen on the trio thread; only ``draft_tokens`` runs in a worker thread, and only one
at a time per session, so the session's KV cache has one user.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field, replace

import trio

from node.drafter.strategies import Behaviour
from node.drafter.terms import Terms
from p2p.messages import MAX_DRAFT_MS, Advance, Draft, Open
from verifier.decode import Proposer
from verifier.errors import SpecmarketError
from verifier.model import common_prefix
from verifier.params import SamplingParams

MS = 1000.0
# an answer to an advance is sent by this share of the target's deadline after the advance arrived:
# the rest covers the way back (framing, the network, both event loops), ~2-3 ms on loopback
ANSWER_SHARE = 0.8
LINK_MARGIN_S = 0.005  # past a long link: both event loops and the framing, on top of its round trip
NO_LIMIT = float("inf")


class ProtocolViolation(SpecmarketError):
    """The target sent a message that does not fit the session (e.g. a k that skips tokens)."""


class Kind(enum.Enum):
    ANSWER = "answer"  # for the confirmed k, basis ()
    EARLY = "early"  # for k + γ + 1, assuming the answer and the predicted bonus are emitted


@dataclass(frozen=True)
class Step:
    kind: Kind
    need: int  # path tokens (from k) the draft needs, at most
    stop_from: int = 0  # a path token at this index or later below the confidence ends the block: stop there


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
    min_confidence: float = 0.0  # a block ends at a token the draft gives less (0: blocks are γ long)
    path: list[int] = field(default_factory=list)  # own draft tokens for k, k+1, ...
    confidence: list[float] = field(default_factory=list)  # the draft's probability of each path token
    epoch: int = 0  # bumped when the path is dropped: an extension still in flight is then discarded
    cancel: threading.Event = field(default_factory=threading.Event)  # set on a drop: stop drafting for it
    interrupt: threading.Event = field(default_factory=threading.Event)  # set on an advance: return, keep the tokens
    deadline_s: float = 0.0  # what the target waits for an answer to an advance (its open; 0: not stated)
    link_rtt_s: float = 0.0  # the link's round trip, when the drafter knows it (a client: node.client.drafting)
    cut_at: int = -1  # the k whose answer the clock ended: send what the path holds
    token_s: float = 0.0  # the last drafted token's time (the clock's estimate of the next one)
    proposals: int = 0  # proposer calls so far
    answered: int = -1  # the k whose answer the target has (ours, or our early draft for it)
    answer_len: int = 0  # ... and its length
    early: tuple[int, tuple[int, ...], int] | None = None  # (start, basis, length) of the newest early draft
    asked_at: float = 0.0  # when the message for k arrived
    answered_at: float = 0.0  # when the answer for k went out (the early draft's work starts there)
    short_at: int = -1  # the k at which the proposer gave fewer tokens than asked: send what there is
    changed: trio.Event = field(default_factory=trio.Event)
    drafts_sent: int = 0
    early_sent: int = 0  # ... of which early drafts (sent while the target verified the answer before)
    rounds: int = 1  # rounds the target asked for: the open, then one per advance
    tokens_sent: int = 0  # draft tokens sent (answers and early drafts), for the session's last log line
    garbage_index: int = 0
    price_wei: int = 0  # what the target pays per accepted draft token (its open)
    terms: Terms | None = None  # a paying open's terms (node.drafter.terms); None: unpaid
    # own count: tokens of this drafter's answers that the emitted tokens matched, in the rounds an advance
    # closed; an upper bound of ``credited`` (the job's last round is only in the settle's count)
    matched: int = 0
    credited: int = 0  # the target's count of this drafter's accepted tokens (its newest advance)
    settled: bool = False  # the target's settle came: the session is over

    @classmethod
    def opened(
        cls,
        msg: Open,
        proposer: Proposer,
        behaviour: Behaviour,
        max_positions: int,
        *,
        overlap: bool,
        min_confidence: float,
    ) -> DraftSession:
        """The session an ``open`` starts (its sampling parameters checked: InvalidParams)."""
        return cls(
            msg.job,
            list(msg.context),
            SamplingParams(msg.temperature, msg.top_k, msg.top_p),
            msg.seed,
            msg.gamma,
            msg.start,
            proposer,
            behaviour,
            max_positions,
            overlap=overlap,
            min_confidence=min_confidence,
            asked_at=time.perf_counter(),
            price_wei=msg.price_wei,
            deadline_s=msg.deadline_ms / MS,
        )

    # -- trio thread ---------------------------------------------------------------------------
    def advance(self, msg: Advance, now: float) -> None:
        if msg.job != self.job:
            raise ProtocolViolation(f"advance for job {msg.job!r} on the stream of job {self.job!r}")
        if msg.start != self.k + len(msg.tokens):
            raise ProtocolViolation(f"advance to k={msg.start} from k={self.k} with {len(msg.tokens)} tokens")
        emitted = list(msg.tokens)
        self.count_accepted(msg, emitted)
        self.rounds += 1
        self.context.extend(emitted)
        self.k, self.asked_at = msg.start, now
        self.interrupt.set()  # an extension in flight returns at its next token: this round needs an answer
        self.interrupt = threading.Event()
        if len(emitted) <= len(self.path) and self.path[: len(emitted)] == emitted:
            del self.path[: len(emitted)]  # as predicted: the rest of the path still holds
            del self.confidence[: len(emitted)]
        else:
            self.drop_path()
        if self.early is not None and self.early[0] <= self.k:
            start, basis, length = self.early  # the target judges it at this round (or has dropped it): one look
            self.early = None
            if start == self.k and tuple(self.context[len(self.context) - len(basis) :]) == basis:
                self.answered, self.answered_at = self.k, now  # the target's own rule: it is this round's answer
                self.answer_len = length
        self.changed.set()

    def count_accepted(self, msg: Advance, emitted: list[int]) -> None:
        """Own count: the answer to the round just ended matched ``emitted`` this far (under GUMBEL
        exactly what verification accepts if the target verified it, so an upper bound of the
        target's count in this advance; the settle's count adds the job's last round, which no
        advance closes), and the target's count, which never decreases."""
        if self.answered == self.k:  # our answer (or our early draft) was this round's
            self.matched += common_prefix(self.path[: self.answer_len], emitted)
        if msg.accepted < self.credited:
            raise ProtocolViolation(
                f"the target's count of accepted tokens fell from {self.credited} to {msg.accepted}"
            )
        self.credited = msg.accepted

    def drop_path(self) -> None:
        self.path.clear()
        self.confidence.clear()
        self.epoch += 1
        self.cancel.set()
        self.cancel = threading.Event()

    def stop(self) -> None:
        """The session ends: a block being drafted stops at its next token."""
        self.cancel.set()

    def block(self, begin: int, room: int) -> tuple[int, bool]:
        """The block of the path from index ``begin``: (its length so far, whether it is complete).
        Complete: γ tokens, the path's room is used up, or it holds a token below the confidence."""
        limit = max(0, min(self.gamma, room - begin))
        for i in range(begin, min(len(self.path), begin + limit)):
            if self.confidence[i] < self.min_confidence:
                return i - begin + 1, True
        n = max(0, min(len(self.path), begin + limit) - begin)
        return n, n >= limit

    def next_step(self) -> Step | None:
        """What to draft and send next; None: nothing until the next advance."""
        room = self.max_positions - len(self.context)  # path tokens the draft model has positions for
        if self.short_at == self.k:
            room = min(room, len(self.path))
        if self.answered != self.k:
            n, complete = self.block(0, room)
            return Step(Kind.ANSWER, n if complete or self.cut_at == self.k else max(0, min(self.gamma, room)))
        begin = self.answer_len + 1  # after the answer and the predicted bonus
        if not self.overlap or (self.early is not None and self.early[0] == self.k + begin):
            return None
        n, complete = self.block(begin, room)
        need = begin + n if complete else min(begin + self.gamma, room)
        return Step(Kind.EARLY, need, stop_from=begin) if need > begin else None

    def draft_for(self, step: Step) -> tuple[Draft, float]:
        """The draft ``step`` sends (draft_ms still 0), and since when the drafter has been at it."""
        room = self.max_positions - len(self.context)
        if step.kind is Kind.ANSWER:
            n, _ = self.block(0, room)
            return Draft(self.job, self.k, tuple(self.path[:n])), self.asked_at
        begin = self.answer_len + 1
        n, _ = self.block(begin, room)
        basis, tokens = tuple(self.path[:begin]), tuple(self.path[begin : begin + n])
        return Draft(self.job, self.k + begin, tokens, basis), self.answered_at

    def mark_sent(self, draft: Draft, since: float, now: float) -> Draft:
        """Record a draft about to go out (before the send, so an advance read meanwhile sees it) and
        stamp it with the drafter's time on it."""
        self.drafts_sent += 1
        if draft.basis:
            self.early = (draft.start, draft.basis, len(draft.tokens))
            self.early_sent += 1
        elif draft.start == self.k:
            self.answered, self.answered_at, self.answer_len = self.k, now, len(draft.tokens)
        return replace(draft, draft_ms=round(min(max(now - since, 0.0) * MS, MAX_DRAFT_MS), 3))

    def answer_until(self) -> float:
        """When the answer to the round in flight must be sent (perf_counter): ``ANSWER_SHARE`` of the
        deadline after its advance came. The open's answer has no clock: the target decodes the prompt's
        round alone and asks for it only at the next round (node.target.config.PREFILL_ALONE)."""
        if not self.deadline_s or self.rounds < 2:
            return NO_LIMIT
        # the target's clock started when it sent the advance: the share leaves a drafter near it both
        # ways of its link; a far one leaves its link's whole round trip (the advance's way here, and back)
        window = min(ANSWER_SHARE * self.deadline_s, self.deadline_s - self.link_rtt_s - LINK_MARGIN_S)
        return self.asked_at + window

    def extension(self, step: Step) -> Extension:
        """What ``draft_tokens`` needs to grow the path towards ``step.need``; an answer's on a clock."""
        return Extension(
            [*self.context, *self.path],
            self.k + len(self.path),
            step.need - len(self.path),
            max(0, step.stop_from - len(self.path)),
            self.answer_until() if step.kind is Kind.ANSWER else NO_LIMIT,
        )

    def extended(self, epoch: int, drafted: Drafted, asked: int, cancel: threading.Event, k: int) -> None:
        """An extension asked for at round ``k`` came back; it is discarded if the path it grew was
        dropped meanwhile."""
        if epoch != self.epoch:
            return
        self.path.extend(drafted.tokens)  # a consistent advance meanwhile only trimmed the path's front
        self.confidence.extend(drafted.confidence)
        if drafted.timed_out:
            self.cut_at = k  # moot if the round moved on meanwhile
        elif len(drafted.tokens) < asked and not cancel.is_set() and not drafted.unsure and not drafted.interrupted:
            self.short_at = self.k

    # -- worker thread -------------------------------------------------------------------------
    def draft_tokens(
        self, ext: Extension, cancel: threading.Event, interrupt: threading.Event | None = None
    ) -> Drafted:
        """Up to ``ext.count`` draft tokens after ``ext.context`` (k of the first: ``ext.start``), one
        proposer call per token, stopping at the first token boundary after ``cancel`` or ``interrupt``
        is set, before a token that would end past ``ext.until``, and after the first token from index
        ``ext.stop_from`` on that is below the confidence."""
        out: list[int] = []
        sure: list[float] = []
        while len(out) < ext.count and not cancel.is_set():
            if interrupt is not None and interrupt.is_set():
                return Drafted(out, sure, interrupted=True)
            began = time.perf_counter()
            if began + self.token_s > ext.until:
                return Drafted(out, sure, timed_out=True)
            k = ext.start + len(out)
            proposal = self.proposer.propose([*ext.context, *out], start=k, gamma=1, params=self.params, seed=self.seed)
            tokens = getattr(proposal, "tokens", ())
            if not tokens:
                break
            if self.proposals:  # the session's first one also prefills the prompt: not a token's time
                self.token_s = time.perf_counter() - began
            self.proposals += 1
            out.append(int(tokens[0]))
            sure.append(own_probability(proposal))
            if len(out) > ext.stop_from and sure[-1] < self.min_confidence:
                return Drafted(out, sure, unsure=True)
        return Drafted(out, sure)


@dataclass(frozen=True)
class Extension:
    """One call of ``draft_tokens``: ``count`` tokens after ``context``, the first at k = ``start``;
    a token below the confidence ends it from the ``stop_from``-th token of the call on."""

    context: list[int]
    start: int
    count: int
    stop_from: int = 0
    until: float = NO_LIMIT  # perf_counter: no token is started that would end after this (an answer's clock)


@dataclass(frozen=True)
class Drafted:
    tokens: list[int]
    confidence: list[float]  # the draft's probability of each token
    unsure: bool = False  # it ended at a token below the confidence
    interrupted: bool = False  # an advance came: the loop plans again (the tokens are kept)
    timed_out: bool = False  # the answer's clock ran out: the answer goes out with the path as it is


def own_probability(proposal: object) -> float:
    """The draft's probability of the token it proposed (``Proposal.confidence``); 1.0 where the
    proposer reports none (a hostile one's blocks are always γ long)."""
    confidence = getattr(proposal, "confidence", None)
    return float(confidence[0]) if confidence else 1.0
