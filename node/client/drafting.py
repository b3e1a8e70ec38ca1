"""`specmarket ask --draft`: the client drafts for its own request (``/specmarket/generate/1.2.0``).

The client loads a draft model (the pair's, or ``--draft-model``) and answers the target's draft
protocol messages, which come on the generate stream between the chunks: an ``open`` (the prompt's
tokens, the sampling parameters, the seed, γ, the deadline) and then an ``advance`` per round. It
drafts exactly as a drafter peer does (node.drafter.session and node.drafter.drive: answers in
time, early drafts while the target verifies), on its own stream, so the drafting never crosses
the target's network to a third party. The target verifies the client's drafts like any drafter's
(node.target.client_drafts): the answer is the target's whatever they are; the client is never paid.

Drafting is the client's own help, never a condition of the answer: an ``open`` this draft model
cannot serve (a token id outside its vocabulary, a context longer than its window), a link whose
round trip leaves no time within the target's draft deadline (timed by the stream's protocol
negotiation and the request's wait for its ``open``), a target that breaks the draft protocol, or a
failed draft send ends the drafting with a warning, the client tells the target (an ``error``
frame), and the answer goes on, drafted by the target's market or decoded alone.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from node.drafter.config import DEFAULT_MIN_CONFIDENCE
from node.drafter.drive import drive
from node.drafter.session import LINK_MARGIN_S, MS, DraftSession, ProtocolViolation
from node.drafter.strategies import STRATEGIES, make_behaviour, make_proposer
from node.model.kernels import DEFAULT_KERNEL
from p2p.framing import FrameStream, StreamFailed
from p2p.messages import Advance, Error, InvalidMessage, Open
from verifier.errors import InvalidParams, SpecmarketError

if TYPE_CHECKING:
    from node.model.adapter import HFCausalLM

log = logging.getLogger(__name__)

STOP_SEND_TIMEOUT_S = 2.0  # telling the target the client stopped drafting: this long, or not at all


class LinkTooSlow(SpecmarketError):
    """The client's link to the target is slower than the target's draft deadline: no draft of its
    could count, so it does not draft."""


@dataclass(frozen=True)
class ClientDraftConfig:
    """How the client drafts: its draft model and, for tests and the lab, a drafter strategy
    (node.drafter.strategies: honest, or a hostile one)."""

    model_dir: Path
    strategy: str = "honest"
    overlap: bool = True  # draft the next block while the target verifies
    min_confidence: float = DEFAULT_MIN_CONFIDENCE
    kernel: str = DEFAULT_KERNEL
    seed: int = 0  # the random strategy's

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InvalidParams(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")


class ClientDrafter:
    """The client's drafter for one request: loads the draft model once, then serves the ``open``
    and ``advance`` messages of its job."""

    def __init__(self, cfg: ClientDraftConfig, loaded: tuple[HFCausalLM, object] | None = None) -> None:
        """``loaded``: the draft model and its tokenizer, loaded before (a client that asks often loads
        them once); None: loaded from ``cfg.model_dir`` now."""
        from node.model.loading import load_model_dir

        self.cfg = cfg
        if loaded is None:
            loaded = load_model_dir(cfg.model_dir, "draft", cfg.kernel)
            loaded[0].fork().extend([loaded[1].eos_token_id])  # warm up: a fresh process's first pass is slow
        self.model, self.tokenizer = loaded
        self.rng = random.Random(cfg.seed)
        self.session: DraftSession | None = None
        self.stopped = ""  # why the client stopped drafting ("": it has not)
        self.scope: trio.CancelScope | None = None
        self.asked_at: float | None = None  # when the request went out: its open's arrival times the link
        self.link_rtt_s: float | None = None  # the link's round trip, as the stream's opening timed it

    def asked(self) -> None:
        """The request is sent now: the open's arrival then bounds the link's round trip from above (the
        target's set-up of the job counts in it)."""
        self.asked_at = time.perf_counter()

    def round_trip_s(self, now: float, deadline_s: float) -> float:
        """The link's round trip, at most a deadline: the least of the stream's opening (one protocol
        negotiation: a round trip and little else) and the request's wait for its open."""
        timed = [t for t in (self.link_rtt_s, None if self.asked_at is None else now - self.asked_at) if t is not None]
        return min([*timed, deadline_s]) if timed else 0.0

    async def take(self, msg: Open | Advance, fs: FrameStream, nursery: trio.Nursery) -> None:
        """One draft protocol message from the target; drafting runs in ``nursery``."""
        if self.stopped:
            return
        try:
            if isinstance(msg, Open):
                self._open(msg, fs, nursery)
            else:
                self._advance(msg)
        except (ProtocolViolation, InvalidParams, InvalidMessage, LinkTooSlow) as exc:
            await self.stop(fs, str(exc))

    def _open(self, msg: Open, fs: FrameStream, nursery: trio.Nursery) -> None:
        if self.session is not None:
            raise ProtocolViolation("a second open on the stream")
        self._check_ids(msg.context)
        fork = self.model.fork()
        if len(msg.context) + msg.gamma > fork.max_positions:
            raise ProtocolViolation(f"a context of {len(msg.context)} tokens does not fit the draft model")
        cfg = self.cfg
        proposer = make_proposer(cfg.strategy, fork, self.tokenizer, self.rng.randrange(1 << 32))
        behaviour = make_behaviour(cfg.strategy, self.rng)
        self.session = DraftSession.opened(
            msg, proposer, behaviour, fork.max_positions, overlap=cfg.overlap, min_confidence=cfg.min_confidence
        )
        self.session.link_rtt_s = rtt_s = self.round_trip_s(time.perf_counter(), msg.deadline_ms / MS)
        if msg.deadline_ms and rtt_s + LINK_MARGIN_S >= msg.deadline_ms / MS:  # no answer could arrive in time:
            raise LinkTooSlow(  # stop at once, so that no round waits a round trip for an empty answer
                f"the link's round trip ({MS * rtt_s:.0f} ms) leaves no time within the target's draft deadline "
                f"({msg.deadline_ms} ms): let the target's drafters draft"
            )
        nursery.start_soon(self._drive, fs, self.session)
        log.info(
            "drafting for job %s (γ=%d, deadline %d ms, link round trip ≤ %.0f ms)",
            msg.job, msg.gamma, msg.deadline_ms, MS * self.session.link_rtt_s,
        )  # fmt: skip

    def _advance(self, msg: Advance) -> None:
        if self.session is None:
            raise ProtocolViolation("an advance before the open")
        self._check_ids(msg.tokens)
        self.session.advance(msg, time.perf_counter())

    def _check_ids(self, tokens: tuple[int, ...]) -> None:
        vocab = self.model.vocab_size
        if any(t >= vocab for t in tokens):
            raise InvalidMessage(f"a token id outside the draft model's vocabulary of {vocab}")

    async def _drive(self, fs: FrameStream, session: DraftSession) -> None:
        with trio.CancelScope() as self.scope:
            try:
                await drive(fs, session, self.model.vocab_size)
            except StreamFailed as exc:  # the answer's reader sees what became of the stream
                self.stopped = f"a draft could not be sent: {exc}"
                log.warning("stopped drafting: %s", self.stopped)

    async def stop(self, fs: FrameStream, why: str) -> None:
        """Stop drafting for good, and tell the target: the job goes on with its market drafters, or alone."""
        self.stopped = why
        log.warning("stopped drafting (the answer goes on without your drafts): %s", why)
        if self.session is not None:
            self.session.stop()
        if self.scope is not None:
            self.scope.cancel()
        with contextlib.suppress(StreamFailed, InvalidMessage):
            await fs.send(Error(f"the client stopped drafting: {why}"[:500]), STOP_SEND_TIMEOUT_S)

    def close(self) -> None:
        """The request is over: a block being drafted stops at its next token."""
        if self.session is not None:
            self.session.stop()
