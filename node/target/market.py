"""The target's drafting market: discovered drafters -> policy -> per-job draft sessions -> ledger.

The target never dials a drafter: a drafter registers over its own connection to the target and
keeps it (registering again when it drops, ``p2p.discovery.announce``), and a job's draft streams
are opened on that connection. A registered drafter without one (it crashed, or is reconnecting)
sits the job out; one that has left is forgotten, its addresses with it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING

import trio
from libp2p.abc import IHost
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID

from market.ledger import Ledger
from market.policy import Policy
from market.registry import Registry
from node.chain import ChainError
from node.target.client_drafts import JobRegistry
from node.target.config import WAIT_BUDGET_SHARE
from node.target.rounds import MarketProposer
from node.target.sessions import RemoteSession
from p2p.discovery import Registration
from p2p.framing import FrameStream, StreamFailed
from p2p.messages import DRAFT_PROTOCOL_ID, MAX_NEW_TOKENS, TO_TARGET, UNPAID, InvalidMessage, PayTerms, Settle
from verifier.params import SamplingParams

if TYPE_CHECKING:
    from node.chain.paymaster import Paymaster

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 0.5  # a drafter whose stream does not open this fast sits the job out
CLOSE_TIMEOUT_S = 1.0


class MarketDrafting:
    """The ``DraftingBackend`` of the engine, backed by drafter peers found over libp2p."""

    def __init__(
        self,
        host: IHost,
        registry: Registry,
        policy: Policy,
        ledger: Ledger,
        *,
        credited: dict[str, int] | None = None,
        background: trio.Nursery | None = None,
        deadline_s: float,
        max_drafters: int,
        vocab_size: int,
        wait_budget: float = WAIT_BUDGET_SHARE,
        paymaster: Paymaster | None = None,
        tree_nodes: int = 0,
    ) -> None:
        self.tree_nodes = tree_nodes  # > 0: each round's answers merged into a tree (node.target.rounds)
        self.host, self.registry, self.policy, self.ledger = host, registry, policy, ledger
        self.credited = {} if credited is None else credited  # the ledger's lifetime credits, mirrored
        self.background = background  # where a job's draft streams are closed (None: before the job ends)
        self.deadline_s, self.max_drafters, self.wait_budget = deadline_s, max_drafters, wait_budget
        self.vocab_size = vocab_size
        self.paymaster = paymaster  # None: drafters are credited in the ledger, not paid
        self.in_jobs: dict[str, int] = {}  # peer -> jobs it is drafting for now
        self.gone: set[str] = set()  # withdrawn or expired while in a job: forget when the job ends

    def on_gone(self, peer_id: str) -> None:
        """Discovery callback: the drafter's registration was withdrawn or expired. Its addresses
        leave the peerstore at once (identify put them there for two hours); its stats stay until
        the jobs it drafts for now are credited."""
        self._forget_addrs(peer_id)
        if self.in_jobs.get(peer_id):
            self.gone.add(peer_id)
        elif peer_id in self.registry:
            log.info("drafter %s left the market", peer_id)
            self.registry.forget(peer_id)

    def _forget_addrs(self, peer_id: str) -> None:
        with contextlib.suppress(ValueError):  # not a peer id (the registry takes any string)
            self.host.get_peerstore().clear_addrs(ID.from_base58(peer_id))

    def on_registration(self, reg: Registration) -> None:
        """Discovery callback: remember the drafter (its addresses are not dialed: see the module)."""
        self.gone.discard(reg.peer_id)  # registered again before its job ended
        self.registry.upsert(reg.peer_id, reg.addrs)

    def connected(self, peer_id: str) -> bool:
        """Whether the target holds an open connection to ``peer_id``: a draft stream then opens
        on it, without a dial."""
        try:
            conns = self.host.get_network().get_connections(ID.from_base58(peer_id))
        except ValueError:
            return False
        return any(not conn.is_closed for conn in conns)

    async def _open(self, peer: str, gamma: int) -> RemoteSession | None:
        try:
            with trio.fail_after(OPEN_TIMEOUT_S):
                stream = await self.host.new_stream(ID.from_base58(peer), [DRAFT_PROTOCOL_ID])
        except (trio.TooSlowError, BaseLibp2pError, OSError, ValueError) as exc:
            log.info("cannot open a draft stream to %s: %s", peer, str(exc) or type(exc).__name__)
            self.registry.record_error(peer, f"stream open failed: {type(exc).__name__}")
            self.policy.update(self.registry, peer)
            return None
        return RemoteSession(peer, FrameStream(stream, vocab_size=self.vocab_size, allowed=TO_TARGET, max_gamma=gamma))

    async def _join(self, peer: str, gamma: int, proposer: MarketProposer) -> None:
        """Open the peer's draft stream while the job runs, then read its drafts. The job never
        waits for an open: a round waits for streams still opening only until its own deadline,
        and a stream that opens later drafts from the next round."""
        session = None
        try:
            session = await self._open(peer, gamma)
            if session is not None:
                self.registry.record_job(peer)
                self.in_jobs[peer] = self.in_jobs.get(peer, 0) + 1
                proposer.join(session)  # joined before it stops counting as opening: no round misses it
        finally:
            proposer.opening -= 1
            proposer.round.changed.set()
        if session is not None:
            await proposer.read_drafts(session)

    def _select(self, exclude: frozenset[str] = frozenset()) -> list[str]:
        """The policy's choice, without the drafters that refused a session lately (full) or have
        left (listed until their jobs are credited). A chosen drafter the target holds no connection
        to sits the job out with an error on its record, as a failed dial used to give it (so a dead
        registration cannot keep the untried slot), but without the dial."""
        out = {p for p in self.registry.peers() if self.registry.is_busy(p) or p in self.gone or p in exclude}
        picked = []
        for peer in self.policy.select(self.registry, self.max_drafters, exclude=out):
            if self.connected(peer):
                picked.append(peer)
                continue
            log.info("drafter %s is not connected; it sits the job out", peer)
            self.registry.record_error(peer, "not connected")
            self.policy.update(self.registry, peer)
        return picked

    @asynccontextmanager
    async def job(
        self,
        job_id: str,
        params: SamplingParams,
        seed: int,
        gamma: int,
        max_tokens: int = MAX_NEW_TOKENS,
        client: RemoteSession | None = None,
    ) -> AsyncIterator:
        """The job's proposer, with the drafters the policy picks and, when the job's client drafts
        for itself (``client``: node.target.client_drafts), the client; None when it has neither."""
        peers = self._select()
        if not peers and client is None:
            yield None
            return
        proposer = MarketProposer(
            [],  # the sessions join as their streams open (_join)
            job=job_id,
            params=params,
            seed=seed,
            gamma=gamma,
            deadline_s=self.deadline_s,
            wait_budget=self.wait_budget,
            registry=self.registry if client is None else JobRegistry(self.registry),
            policy=self.policy,
            terms=self.paymaster.terms(self.ledger.lane, max_tokens) if self.paymaster is not None else UNPAID,
            tree_nodes=self.tree_nodes,
        )
        if self.paymaster is not None and self.background is not None:
            proposer.on_payout = partial(self._start_cover, proposer.terms)
        proposer.opening = len(peers)
        log.info("job %s: drafting with %s", job_id, ", ".join([*peers, *(["its client"] if client else [])]))
        try:
            async with trio.open_nursery() as nursery:
                if client is not None:
                    proposer.client = client
                    proposer.join(client)
                    nursery.start_soon(proposer.read_drafts, client)
                for peer in peers:
                    nursery.start_soon(self._join, peer, gamma, proposer)
                proposer.refill = partial(self._refill, nursery, proposer, gamma)
                try:
                    yield proposer
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._close(job_id, [s for s in proposer.sessions if s is not client])

    def _refill(self, nursery: trio.Nursery, proposer: MarketProposer, gamma: int) -> bool:
        """A job whose drafters were all dropped (benched, failed, timed out) asks the policy's next
        choice among the peers it has not had, rather than decoding the rest alone."""
        peers = self._select(exclude=frozenset(s.peer_id for s in proposer.sessions))
        if not peers:
            return False
        proposer.opening += 1
        nursery.start_soon(self._join, peers[0], gamma, proposer)
        log.info("job %s: its drafters were dropped; drafting with %s instead", proposer.job, peers[0])
        return True

    async def _close(self, job_id: str, sessions: list[RemoteSession]) -> None:
        for s in sessions:
            s.kill("job finished")
            self.in_jobs[s.peer_id] -= 1
            if not self.in_jobs[s.peer_id]:
                del self.in_jobs[s.peer_id]
                if s.peer_id in self.gone:
                    self.gone.discard(s.peer_id)
                    self.on_gone(s.peer_id)
        vouchers = await self._credit(job_id, sessions)
        settles = [(s, Settle(job_id, s.accepted, vouchers.get(s.peer_id, ""))) for s in sessions]
        if self.background is not None:  # the job's answer never waits for its streams to close
            self.background.start_soon(_close_streams, settles)
        else:
            await _close_streams(settles)

    async def _credit(self, job_id: str, sessions: list[RemoteSession]) -> dict[str, str]:
        """Credit the job in the ledger and, for a paying operator, sign each paid drafter's voucher
        in the same transaction: peer id -> voucher JSON."""
        credits = {s.peer_id: (s.accepted, s.proposed) for s in sessions if s.proposed}
        if not credits:
            return {}
        if self.paymaster is None:
            new = await trio.to_thread.run_sync(self.ledger.credit, job_id, credits)
            vouchers: dict[str, str] | None = {} if new else None
        else:
            pay = self.paymaster.pay({s.peer_id: s.payout for s in sessions if s.payout is not None})
            vouchers = await trio.to_thread.run_sync(self.ledger.credit_and_pay, job_id, credits, pay)
            if vouchers and self.background is not None:  # the escrow now, for /health: a chain read, off the loop
                self.background.start_soon(_refresh_escrow, self.paymaster)
                for peer in vouchers:  # each paid lane topped up for the next job now, not at its open
                    self._start_cover(self.paymaster.terms(self.ledger.lane, MAX_NEW_TOKENS), pay.payees[peer])
        if vouchers is None:  # credited before: nothing new to mirror or send
            return {}
        for peer, (accepted, _) in credits.items():
            self.credited[peer] = self.credited.get(peer, 0) + accepted
        return vouchers

    def _start_cover(self, terms: PayTerms, drafter: str) -> None:
        """In the background: fund ``drafter``'s lane to cover what the ledger's vouchers leave
        unredeemed plus one job of ``terms`` (the drafter checks that before it drafts, with --rpc)."""
        if self.background is not None and self.paymaster is not None:
            self.background.start_soon(_cover_lane, self.paymaster, self.ledger, terms, drafter)


async def _cover_lane(paymaster: Paymaster, ledger: Ledger, terms: PayTerms, drafter: str) -> None:
    def cover() -> int:
        signed = ledger.voucher(paymaster.tag, drafter)
        return paymaster.cover(drafter, terms.lane, signed[0] if signed else 0, terms.max_pay_wei)

    try:
        await trio.to_thread.run_sync(cover)
    except (ChainError, OSError) as exc:
        log.warning("cannot fund drafter %s's lane: %s", drafter, exc)


async def _refresh_escrow(paymaster: Paymaster) -> None:
    try:
        await trio.to_thread.run_sync(paymaster.refresh)
    except (ChainError, OSError) as exc:  # OSError: the RPC endpoint went away
        log.warning("cannot read the drafter escrow: %s", exc)


async def _close_streams(settles: list[tuple[RemoteSession, Settle]]) -> None:
    """Send each drafter of a finished job its ``settle`` (accepted tokens, voucher), then close the
    job's draft streams: all at once, within CLOSE_TIMEOUT_S."""

    async def settle_and_close(session: RemoteSession, settle: Settle) -> None:
        with contextlib.suppress(StreamFailed, InvalidMessage):
            await session.fs.send(settle, CLOSE_TIMEOUT_S)
        await session.fs.close()

    with trio.move_on_after(CLOSE_TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            for session, settle in settles:
                nursery.start_soon(settle_and_close, session, settle)
