"""The drafter peer: registers with a target's rendezvous point and serves draft sessions.

One long-lived stream per job. The target sends ``open`` (context, sampling params, seed, γ, k, its
price per accepted token), then ``advance`` (the tokens emitted since the last message, and this
drafter's accepted count), and last ``settle`` (the job's accepted count and the operator's voucher,
kept in the drafter's wallet: node.drafter.wallet). A drafter with a payout address names it in a
``payout`` message right after the ``open``. The drafter answers each open/advance with a
``draft`` for positions k .. k+γ-1 and, with overlap on, then drafts on while the target verifies
and sends an early draft for the round after (``node.drafter.session``). Per session one task reads
the stream (so an ``advance`` is seen at once, even mid-draft) and one drafts and sends; each session
keeps its own KV cache (a fork of the draft model sharing its weights), used by one worker thread at
a time. Drafters post no bond and are never slashed: all they can lose is the effort of drafting.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import random
import time
from functools import partial

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from node.chain.vouchers import SignedVoucher
from node.drafter.config import DrafterConfig
from node.drafter.cover import CoverChecks
from node.drafter.cover_watch import CoverCheck, CoverWatch
from node.drafter.drive import drive
from node.drafter.redeem import redeem_voucher
from node.drafter.session import DraftSession, ProtocolViolation
from node.drafter.strategies import make_behaviour, make_proposer
from node.drafter.terms import Terms
from node.drafter.wallet import Wallet, WalletFull
from node.model.adapter import HFCausalLM
from node.model.loading import load_model_dir, tokenizer_fingerprint
from node.model.prefix_cache import PrefixCache
from node.runtime.web import http_json
from p2p.discovery import PointLink, announce, drafter_namespace, withdraw
from p2p.framing import FrameStream, StreamEnded, StreamFailed
from p2p.host import InvalidAddress, parse_peer_addr, peer_addrs, running_host
from p2p.messages import DRAFT_PROTOCOL_ID, TO_DRAFTER, Advance, Error, InvalidMessage, Open, Payout, Settle
from verifier.errors import InvalidParams, SpecmarketError, error_leaves
from verifier.params import SamplingParams

log = logging.getLogger(__name__)

SESSION_IDLE_TIMEOUT_S = 300.0  # a target silent this long has abandoned the job
SEND_TIMEOUT_S = 5.0
MAX_SESSIONS = 32  # sessions at once; one more is refused with an error frame (the target holds no grudge)
REFUSE_SEND_TIMEOUT_S = 2.0
LOOKUP_TIMEOUT_S = 5.0  # the target's /health must answer this soon (--target-http)
MAX_HEALTH_BYTES = 1 << 20
MAX_LOOKUP_ADDRS = 16


class Refused(SpecmarketError):
    """This drafter does not draft for the target: its wallet says the target does not pay, or the
    ``open`` offers less than the drafter's --min-price."""


def addrs_of(peer_id: ID, texts: list) -> list[multiaddr.Multiaddr]:
    """The transport parts of those ``texts`` that are multiaddrs of ``peer_id``."""
    found = []
    for text in texts:
        try:
            info = parse_peer_addr(text) if isinstance(text, str) else None
        except InvalidAddress:
            continue
        if info is not None and info.peer_id == peer_id:
            found += info.addrs
    return found


def _job(session: DraftSession | None) -> str:
    return "" if session is None else f"job {session.job}: "


def _log_end(fs: FrameStream, session: DraftSession | None, exc: StreamEnded) -> None:
    """The target closed the stream between frames: the normal end of a session (the target closes
    it when the job is done), unless the connection went with it."""
    if getattr(fs.stream.muxed_conn, "is_closed", False):
        log.warning("%ssession with %s failed: the connection was lost", _job(session), fs.peer_id)
    elif session is None:
        log.info("%s before opening a session", exc)
    else:
        rounds = f"{session.rounds} round{'' if session.rounds == 1 else 's'}"
        log.info(
            "job %s: session with %s ended (%s, %d draft tokens sent)",
            session.job,
            fs.peer_id,
            rounds,
            session.tokens_sent,
        )


async def _refuse(fs: FrameStream, reason: str, level: int = logging.WARNING) -> None:
    """Say why in an ``error`` frame: a refusal, not a failure (the target does not bench for it).
    To a stranger or full, it is sent without reading the ``open``; unpaid or too cheap, after it."""
    log.log(level, "refusing a session from %s: %s", fs.peer_id, reason)
    with contextlib.suppress(StreamFailed, InvalidMessage):
        await fs.send(Error(reason), REFUSE_SEND_TIMEOUT_S)


class DrafterNode:
    def __init__(self, cfg: DrafterConfig) -> None:
        self.cfg = cfg
        self.model, self.tokenizer = load_model_dir(cfg.model_dir, "draft", cfg.kernel)
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.rng = random.Random(cfg.seed)
        self.sessions = 0
        self.max_sessions = MAX_SESSIONS
        self.host: IHost | None = None
        # INVARIANT: draft sessions come from the target this drafter registered with, and from no one else
        self.target = str(parse_peer_addr(cfg.bootstrap).peer_id)
        self.model.fork().extend([self.tokenizer.eos_token_id])  # warm up: the first forward pass is slow
        self.prefixes = PrefixCache(self.model)  # node.model.prefix_cache
        self.wallet = Wallet.open(cfg.data_dir, cfg.payout, lock=True)  # one drafter per data dir
        # with --rpc, each paid job's escrow and lane check (node.drafter.cover_watch)
        self.cover = CoverWatch(CoverChecks(cfg.rpc), self.wallet) if cfg.rpc else None
        self.background: trio.Nursery | None = None  # cover checks and redemptions run here (run())

    def _new_session(self, msg: Open) -> DraftSession:
        SamplingParams(msg.temperature, msg.top_k, msg.top_p)  # raises InvalidParams before any fork
        fork: HFCausalLM = self.prefixes.fork_for(msg.context)  # the prompt's shared prefix already cached
        if len(msg.context) + msg.gamma > fork.max_positions:
            raise ProtocolViolation(f"context of {len(msg.context)} tokens does not fit the draft model")
        proposer = make_proposer(self.cfg.strategy, fork, self.tokenizer, self.rng.randrange(1 << 32))
        behaviour = make_behaviour(self.cfg.strategy, self.rng, self.cfg.slow_ms)
        cfg = self.cfg
        return DraftSession.opened(
            msg, proposer, behaviour, fork.max_positions, overlap=cfg.overlap, min_confidence=cfg.min_confidence
        )

    async def _open_session(self, fs: FrameStream) -> DraftSession:
        first = await fs.receive(SESSION_IDLE_TIMEOUT_S)
        if not isinstance(first, Open):
            raise ProtocolViolation(f"expected open, got {type(first).__name__.lower()}")
        terms = Terms.of(first)  # who pays, from where: the wallet's account is the operator's, not the peer's
        if terms is not None and (refusal := self.wallet.refusal(terms.account)) is not None:
            raise Refused(refusal)
        if first.price_wei < self.cfg.min_price_wei:  # before any work: no fork, no forward pass
            raise Refused(f"price {first.price_wei} wei per accepted token is below this drafter's minimum "
                          f"{self.cfg.min_price_wei} wei (--min-price)")  # fmt: skip
        session = self._new_session(first)
        if terms is not None:
            session.terms = terms
            try:
                self.wallet.opened(terms)
            except WalletFull as exc:
                raise Refused(str(exc)) from None
            if self.wallet.payout is not None:  # before any draft: the target pays this address
                await fs.send(Payout(first.job, self.wallet.payout), SEND_TIMEOUT_S)
        log.info(
            "job %s: session opened by %s (γ=%d, context %d tokens, overlap %s)",
            first.job,
            fs.peer_id,
            first.gamma,
            len(first.context),
            "on" if session.overlap else "off",
        )
        return session

    async def _serve_session(self, fs: FrameStream, session: DraftSession) -> None:
        try:
            async with trio.open_nursery() as nursery:
                if session.terms is not None and self.cover is not None and self.wallet.payout is not None:
                    check, wait_first = self.cover.start(self.background or nursery, session.terms, self.wallet.payout)
                    if wait_first:  # another job of this operator is still at risk: this one drafts once covered
                        await self._covered(check)
                    else:
                        nursery.start_soon(self._covered, check)
                nursery.start_soon(drive, fs, session, self.model.vocab_size)
                await self._read_advances(fs, session)
        except BaseExceptionGroup as group:  # the reader's end (or a failed send) is the session's end
            raise error_leaves(group)[0] from None

    async def _read_advances(self, fs: FrameStream, session: DraftSession) -> None:
        """Read the target's messages as they come, drafting or not; ends the session by raising."""
        try:
            while True:
                msg = await fs.receive(SESSION_IDLE_TIMEOUT_S)
                if session.settled or isinstance(msg, Open):
                    raise ProtocolViolation(
                        f"{type(msg).__name__.lower()} after the session's {'settle' if session.settled else 'open'}"
                    )
                if isinstance(msg, Settle):
                    self._settle(fs.peer_id, session, msg)
                    session.stop()  # nothing more to draft: the target closes the stream next
                    continue
                assert isinstance(msg, Advance)  # FrameStream(allowed=TO_DRAFTER)
                session.advance(msg, time.perf_counter())
        finally:
            session.stop()

    def _settle(self, target: str, session: DraftSession, msg: Settle | None) -> None:
        """The job is over: its accepted tokens and voucher go to the wallet (``msg`` None: the stream
        ended without a settle, so the last advance's count stands, with no voucher)."""
        if msg is not None and (msg.job != session.job or msg.accepted < session.credited):
            raise ProtocolViolation(f"settle for job {msg.job!r} with {msg.accepted} accepted does not fit the session")
        session.settled = True
        if session.terms is None:
            return
        accepted, voucher = (msg.accepted, msg.voucher) if msg is not None else (session.credited, "")
        kept = self.wallet.settle(session.terms, session.job, accepted, voucher)
        log.info(
            "job %s: credited by the target: %d draft tokens at %d wei (by its last advance: %d; matched by "
            "this drafter's own count, which bounds that: %d)%s",
            session.job, accepted, session.price_wei, session.credited, session.matched,
            f"; voucher for {kept.voucher.cumulative_wei} wei in all" if kept is not None else "",
        )  # fmt: skip
        if kept is not None and self.cfg.redeem_above is not None and self.background is not None:
            self.background.start_soon(self._redeem, session.terms.account, kept)

    async def _covered(self, check: CoverCheck) -> None:
        """Refused (which ends the session) once the job's cover check failed (node.drafter.cover_watch)."""
        await check.done.wait()
        if check.why:
            raise Refused(f"unpaid: {check.why}")

    async def _redeem(self, account: str, kept: SignedVoucher) -> None:
        """With --redeem-above: redeem once the voucher's lane owes this drafter that much (a chain call,
        in a worker thread)."""
        cfg = self.cfg
        assert cfg.rpc is not None and cfg.key_file is not None and cfg.redeem_above is not None
        try:
            redeem = partial(redeem_voucher, cfg.rpc, cfg.key_file, account, kept, cfg.redeem_above)
            row = await trio.to_thread.run_sync(redeem, abandon_on_cancel=True)
            (log.warning if row.error else log.info)("%s", row.line())
        except (SpecmarketError, OSError) as exc:
            log.warning("cannot redeem %s's voucher: %s", account, exc)

    async def handle_stream(self, stream: INetStream) -> None:
        fs = FrameStream(stream, vocab_size=self.model.vocab_size, allowed=TO_DRAFTER)
        if fs.peer_id != self.target:  # a stranger: no session slot, no wallet account, no work
            await _refuse(
                fs, f"this drafter drafts only for the target it registered with, {self.target}", logging.INFO
            )
            await fs.close()
            return
        if self.sessions >= self.max_sessions:
            await _refuse(fs, f"busy: {self.sessions} sessions open (at most {self.max_sessions})")
            await fs.close()
            return
        self.sessions += 1
        session: DraftSession | None = None
        try:
            session = await self._open_session(fs)
            await self._serve_session(fs, session)
        except StreamEnded as exc:
            _log_end(fs, session, exc)
        except Refused as exc:  # unpaid: the stream closes below
            await _refuse(fs, str(exc))
        except (InvalidMessage, ProtocolViolation, InvalidParams) as exc:
            log.warning("%sdropping the stream from %s: %s", _job(session), fs.peer_id, exc)
        except StreamFailed as exc:
            log.warning("%ssession with %s failed: %s", _job(session), fs.peer_id, exc)
        except (BaseLibp2pError, OSError) as exc:
            log.warning("%ssession with %s failed: %s: %s", _job(session), fs.peer_id, type(exc).__name__, exc)
        finally:
            self.sessions -= 1
            if session is not None and not session.settled:  # the last advance's count, with no voucher
                with contextlib.suppress(ProtocolViolation):
                    self._settle(fs.peer_id, session, None)
            await fs.close()
            if session is not None and hasattr(session.proposer, "model"):
                self.prefixes.keep(session.proposer.model, len(session.context) - session.k)

    async def find_target(self) -> PeerInfo | None:
        """Where the target listens now, from its HTTP API's /health (``--target-http``): those of
        its multiaddrs with the bootstrap's peer id (the URL may move the target, never replace it).
        None when it does not answer in time or names no such address."""
        assert self.cfg.target_http is not None
        url = f"{self.cfg.target_http.rstrip('/')}/health"
        peer_id = parse_peer_addr(self.cfg.bootstrap).peer_id
        fetch = partial(http_json, url, timeout_s=LOOKUP_TIMEOUT_S, max_bytes=MAX_HEALTH_BYTES)
        health = None
        with trio.move_on_after(2 * LOOKUP_TIMEOUT_S):  # urllib's timeout is per read, not in all
            try:
                health = await trio.to_thread.run_sync(fetch, abandon_on_cancel=True)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                log.info("cannot look up the target at %s: %s", url, exc)
        texts = health.get("multiaddrs") if isinstance(health, dict) else None
        found = addrs_of(peer_id, texts[:MAX_LOOKUP_ADDRS] if isinstance(texts, list) else [])
        return PeerInfo(peer_id, found) if found else None

    def request_stop(self) -> None:
        """Graceful shutdown (call from the trio thread): unregister, close, return from run()."""
        self._stopping.set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start the host, register with the bootstrap target, serve until ``request_stop()``
        (then withdraw the registration and return) or until cancelled."""
        self._stopping = trio.Event()
        bootstrap = parse_peer_addr(self.cfg.bootstrap)
        try:
            async with running_host(self.cfg.data_dir, self.cfg.listen) as host, trio.open_nursery() as nursery:
                self.host = host
                self.background = nursery
                host.set_stream_handler(DRAFT_PROTOCOL_ID, self.handle_stream)
                namespace = drafter_namespace(self.fingerprint)
                relocate = self.find_target if self.cfg.target_http else None
                link = PointLink()  # whether the target is gone: said once, by announce or withdraw
                await nursery.start(partial(announce, relocate=relocate, link=link), host, bootstrap, namespace)
                log.info("drafter %s (%s) ready", host.get_id(), self.cfg.strategy)
                task_status.started(peer_addrs(host))
                await self._stopping.wait()
                await withdraw(host, bootstrap, namespace, link)  # while the host still runs, so it gets out
                nursery.cancel_scope.cancel()
        finally:
            self.wallet.close()  # the data dir is free for the next drafter
