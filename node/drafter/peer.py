"""The drafter peer: registers with a target's rendezvous point and serves draft sessions.

One long-lived stream per job. The target sends ``open`` (context, sampling params, seed, γ, k),
then ``advance`` (the tokens emitted since the last message); after each, the drafter answers with
a ``draft`` block for positions k .. k+γ-1. Each session keeps its own KV cache (a fork of the
draft model sharing its weights). Drafters post no bond and are never slashed: all they can lose
is the effort of drafting.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import trio
from libp2p.abc import IHost, INetStream
from libp2p.exceptions import BaseLibp2pError
from libp2p.utils.varint import encode_uvarint

from node.drafter.config import DrafterConfig
from node.drafter.strategies import (
    Behaviour,
    garbage_frames,
    make_behaviour,
    make_proposer,
)
from node.models import HFCausalLM, load_model_dir, tokenizer_fingerprint
from p2p.discovery import announce, drafter_namespace, withdraw
from p2p.framing import FrameStream, StreamFailed
from p2p.host import parse_peer_addr, peer_addrs, running_host
from p2p.messages import DRAFT_PROTOCOL_ID, TO_DRAFTER, Advance, Draft, InvalidMessage, Open
from verifier.decode import Proposer
from verifier.errors import InvalidParams, SpecmarketError
from verifier.params import SamplingParams

log = logging.getLogger(__name__)

SESSION_IDLE_TIMEOUT_S = 300.0  # a target silent this long has abandoned the job
SEND_TIMEOUT_S = 5.0
MAX_SESSIONS = 32


class ProtocolViolation(SpecmarketError):
    """The target sent a message that does not fit the session (e.g. a k that skips tokens)."""


@dataclass
class DraftSession:
    """Drafter-side state of one job: the context the target has confirmed, and where k is."""

    job: str
    context: list[int]
    params: SamplingParams
    seed: int
    gamma: int
    k: int
    proposer: Proposer
    behaviour: Behaviour
    drafts_sent: int = 0
    garbage_index: int = 0

    def advance(self, msg: Advance) -> None:
        if msg.job != self.job:
            raise ProtocolViolation(f"advance for job {msg.job!r} on the stream of job {self.job!r}")
        if msg.start != self.k + len(msg.tokens):
            raise ProtocolViolation(f"advance to k={msg.start} from k={self.k} with {len(msg.tokens)} tokens")
        self.context.extend(msg.tokens)
        self.k = msg.start

    def draft(self) -> Draft:  # runs in a worker thread (model forward passes)
        proposal = self.proposer.propose(
            self.context, start=self.k, gamma=self.gamma, params=self.params, seed=self.seed
        )
        return Draft(self.job, self.k, tuple(int(t) for t in proposal.tokens))


class DrafterNode:
    def __init__(self, cfg: DrafterConfig) -> None:
        self.cfg = cfg
        self.model, self.tokenizer = load_model_dir(cfg.model_dir, "draft")
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.rng = random.Random(cfg.seed)
        self.sessions = 0
        self.host: IHost | None = None
        self.model.fork().extend([self.tokenizer.eos_token_id])  # warm up: the first forward pass is slow

    def _new_session(self, msg: Open) -> DraftSession:
        params = SamplingParams(msg.temperature, msg.top_k, msg.top_p)  # raises InvalidParams
        fork: HFCausalLM = self.model.fork()
        if len(msg.context) + msg.gamma > fork.max_positions:
            raise ProtocolViolation(f"context of {len(msg.context)} tokens does not fit the draft model")
        proposer = make_proposer(self.cfg.strategy, fork, self.tokenizer, self.rng.randrange(1 << 32))
        behaviour = make_behaviour(self.cfg.strategy, self.rng, self.cfg.slow_ms)
        return DraftSession(msg.job, list(msg.context), params, msg.seed, msg.gamma, msg.start, proposer, behaviour)

    async def _reply(self, fs: FrameStream, session: DraftSession) -> None:
        b = session.behaviour
        if b.garbage:
            frames = garbage_frames(session.job, session.k, self.model.vocab_size)
            body = frames[session.garbage_index % len(frames)]
            session.garbage_index += 1
            log.info("job %s: sending a malformed frame (%d bytes) on purpose", session.job, len(body))
            with trio.fail_after(SEND_TIMEOUT_S):
                await fs.stream.write(encode_uvarint(len(body)) + body)
            return
        if len(session.context) + session.gamma > self.model.max_positions:
            draft = Draft(session.job, session.k, ())  # out of room: an empty draft is still a valid answer
        else:
            draft = await trio.to_thread.run_sync(session.draft)
        if b.delay_s:
            await trio.sleep(b.delay_s)
        await fs.send(draft, SEND_TIMEOUT_S)
        session.drafts_sent += 1
        log.debug("job %s: drafted %d tokens at k=%d", session.job, len(draft.tokens), draft.start)
        if b.drop_after is not None and session.drafts_sent >= b.drop_after:
            log.info("job %s: dropping the connection on purpose (flaky)", session.job)
            await fs.stream.muxed_conn.close()

    async def _serve_session(self, fs: FrameStream) -> None:
        first = await fs.receive(SESSION_IDLE_TIMEOUT_S)
        if not isinstance(first, Open):
            raise ProtocolViolation(f"expected open, got {type(first).__name__.lower()}")
        session = self._new_session(first)
        log.info(
            "job %s: session opened by %s (γ=%d, context %d tokens)",
            first.job,
            fs.peer_id,
            first.gamma,
            len(first.context),
        )
        await self._reply(fs, session)
        while True:
            msg = await fs.receive(SESSION_IDLE_TIMEOUT_S)
            if not isinstance(msg, Advance):
                raise ProtocolViolation(f"expected advance, got {type(msg).__name__.lower()}")
            session.advance(msg)
            await self._reply(fs, session)

    async def handle_stream(self, stream: INetStream) -> None:
        fs = FrameStream(stream, vocab_size=self.model.vocab_size, allowed=TO_DRAFTER)
        if self.sessions >= MAX_SESSIONS:
            log.warning("refusing a session from %s: %d sessions open", fs.peer_id, self.sessions)
            await fs.reset()
            return
        self.sessions += 1
        try:
            await self._serve_session(fs)
        except StreamFailed as exc:
            log.info("session with %s ended: %s", fs.peer_id, exc)
        except (InvalidMessage, ProtocolViolation, InvalidParams) as exc:
            log.warning("dropping the stream from %s: %s", fs.peer_id, exc)
        except (BaseLibp2pError, OSError) as exc:
            log.info("session with %s failed: %s: %s", fs.peer_id, type(exc).__name__, exc)
        finally:
            self.sessions -= 1
            await fs.close()

    def request_stop(self) -> None:
        """Graceful shutdown (call from the trio thread): unregister, close, return from run()."""
        self._stopping.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the host, register with the bootstrap target, serve until ``request_stop()``
        (then withdraw the registration and return) or until cancelled."""
        self._stopping = trio.Event()
        bootstrap = parse_peer_addr(self.cfg.bootstrap)
        async with running_host(self.cfg.data_dir, self.cfg.listen) as host, trio.open_nursery() as nursery:
            self.host = host
            host.set_stream_handler(DRAFT_PROTOCOL_ID, self.handle_stream)
            namespace = drafter_namespace(self.fingerprint)
            await nursery.start(announce, host, bootstrap, namespace)
            log.info("drafter %s (%s) ready", host.get_id(), self.cfg.strategy)
            task_status.started(peer_addrs(host))
            await self._stopping.wait()
            await withdraw(host, bootstrap, namespace)  # while the host still runs, so it gets out
            nursery.cancel_scope.cancel()
