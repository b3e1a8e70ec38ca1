"""The target's drafting market: discovered drafters -> policy -> per-job draft sessions -> ledger."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.id import ID

from market.ledger import Ledger
from market.policy import Policy
from market.registry import Registry
from node.target.config import WAIT_BUDGET_SHARE
from node.target.rounds import MarketProposer, RemoteSession
from p2p.discovery import Registration
from p2p.framing import FrameStream
from p2p.messages import DRAFT_PROTOCOL_ID, TO_TARGET
from verifier.params import SamplingParams

log = logging.getLogger(__name__)

OPEN_TIMEOUT_S = 0.5  # a drafter whose stream does not open this fast sits the job out
PEERSTORE_TTL_S = 600
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
        deadline_s: float,
        max_drafters: int,
        vocab_size: int,
        wait_budget: float = WAIT_BUDGET_SHARE,
    ) -> None:
        self.host, self.registry, self.policy, self.ledger = host, registry, policy, ledger
        self.deadline_s, self.max_drafters, self.wait_budget = deadline_s, max_drafters, wait_budget
        self.vocab_size = vocab_size
        self.in_jobs: dict[str, int] = {}  # peer -> jobs it is drafting for now
        self.gone: set[str] = set()  # withdrawn while in a job: forget when the job ends

    def on_gone(self, peer_id: str) -> None:
        """Discovery callback: the drafter's registration was withdrawn or expired."""
        if self.in_jobs.get(peer_id):
            self.gone.add(peer_id)
        elif peer_id in self.registry:
            log.info("drafter %s left the market", peer_id)
            self.registry.forget(peer_id)

    def on_registration(self, reg: Registration) -> None:
        """Discovery callback: remember the drafter and where to dial it."""
        if self.registry.upsert(reg.peer_id, reg.addrs):
            addrs = []
            for a in reg.addrs:
                try:
                    addrs.append(multiaddr.Multiaddr(a))
                except (ValueError, TypeError, multiaddr.exceptions.Error):
                    continue
            self.host.get_peerstore().add_addrs(ID.from_base58(reg.peer_id), addrs, PEERSTORE_TTL_S)

    async def _open(self, peer: str, gamma: int, opened: list[RemoteSession]) -> None:
        try:
            with trio.fail_after(OPEN_TIMEOUT_S):
                stream = await self.host.new_stream(ID.from_base58(peer), [DRAFT_PROTOCOL_ID])
        except (trio.TooSlowError, BaseLibp2pError, OSError, ValueError) as exc:
            log.info("cannot open a draft stream to %s: %s", peer, exc or type(exc).__name__)
            self.registry.record_error(peer, f"stream open failed: {type(exc).__name__}")
            self.policy.update(self.registry, peer)
            return
        fs = FrameStream(stream, vocab_size=self.vocab_size, allowed=TO_TARGET, max_gamma=gamma)
        opened.append(RemoteSession(peer, fs))

    async def _open_all(self, peers: list[str], gamma: int) -> list[RemoteSession]:
        opened: list[RemoteSession] = []
        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(self._open, peer, gamma, opened)
        return opened

    def _select(self) -> list[str]:
        """The policy's choice, without the drafters that refused a session lately (full)."""
        busy = {p for p in self.registry.peers() if self.registry.is_busy(p)}
        chosen = self.policy.select(self.registry, self.max_drafters + len(busy))
        return [p for p in chosen if p not in busy][: self.max_drafters]

    @asynccontextmanager
    async def job(self, job_id: str, params: SamplingParams, seed: int, gamma: int) -> AsyncIterator:
        peers = self._select()
        sessions = await self._open_all(peers, gamma) if peers else []
        if not sessions:
            yield None
            return
        for s in sessions:
            self.registry.record_job(s.peer_id)
            self.in_jobs[s.peer_id] = self.in_jobs.get(s.peer_id, 0) + 1
        proposer = MarketProposer(
            sessions,
            job=job_id,
            params=params,
            seed=seed,
            gamma=gamma,
            deadline_s=self.deadline_s,
            wait_budget=self.wait_budget,
            registry=self.registry,
            policy=self.policy,
        )
        log.info("job %s: drafting with %s", job_id, ", ".join(s.peer_id for s in sessions))
        try:
            async with trio.open_nursery() as nursery:
                for s in sessions:
                    nursery.start_soon(proposer.read_drafts, s)
                try:
                    yield proposer
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._close(job_id, sessions)

    async def _close(self, job_id: str, sessions: list[RemoteSession]) -> None:
        for s in sessions:
            s.kill("job finished")
            self.in_jobs[s.peer_id] -= 1
            if not self.in_jobs[s.peer_id]:
                del self.in_jobs[s.peer_id]
                if s.peer_id in self.gone:
                    self.gone.discard(s.peer_id)
                    self.on_gone(s.peer_id)
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            async with trio.open_nursery() as nursery:
                for s in sessions:
                    nursery.start_soon(s.fs.close)
        credits = {s.peer_id: (s.accepted, s.proposed) for s in sessions if s.proposed}
        if credits:
            await trio.to_thread.run_sync(self.ledger.credit, job_id, credits)
