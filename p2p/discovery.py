"""Drafter discovery through a libp2p rendezvous point hosted by the target.

Drafters register under ``specmarket/drafters/<tokenizer fingerprint>`` so that only peers with
the target's vocabulary are found; a drafter needs nothing but the target's (bootstrap) multiaddr.
The rendezvous protocol only lets a peer register itself, so a registration cannot name a victim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import multiaddr
import trio
from libp2p.abc import IHost
from libp2p.discovery.rendezvous import RendezvousClient, RendezvousError, RendezvousService
from libp2p.exceptions import BaseLibp2pError
from libp2p.peer.peerinfo import PeerInfo

log = logging.getLogger(__name__)

NAMESPACE_PREFIX = "specmarket/drafters/"
REGISTRATION_TTL_S = 300  # py-libp2p's minimum is 120 s
REFRESH_EVERY_S = REGISTRATION_TTL_S / 3
CONNECT_TIMEOUT_S = 5.0
RETRY_BASE_S = 0.5
RETRY_MAX_S = 30.0
WATCH_INTERVAL_S = 0.2
UNREGISTER_TIMEOUT_S = 2.0


def drafter_namespace(fingerprint: str) -> str:
    return NAMESPACE_PREFIX + fingerprint


@dataclass(frozen=True)
class Registration:
    peer_id: str
    addrs: tuple[str, ...]


async def _register_once(host: IHost, bootstrap: PeerInfo, namespace: str) -> None:
    with trio.fail_after(CONNECT_TIMEOUT_S):
        await host.connect(bootstrap)
    await RendezvousClient(host, bootstrap.peer_id).register(namespace, ttl=REGISTRATION_TTL_S)


async def announce(host: IHost, bootstrap: PeerInfo, namespace: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Register with the rendezvous point and keep the registration fresh, forever.

    Retries with exponential backoff while the bootstrap peer is unreachable; signals
    ``task_status.started()`` after the first successful registration.
    """
    delay, started = RETRY_BASE_S, False
    while True:
        try:
            await _register_once(host, bootstrap, namespace)
        except (trio.TooSlowError, RendezvousError, BaseLibp2pError, OSError, ValueError) as exc:
            log.warning("registering with %s failed (%s); retrying in %.1f s", bootstrap.peer_id, exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        if not started:
            log.info("registered with %s under %s", bootstrap.peer_id, namespace)
            task_status.started()
            started = True
        delay = RETRY_BASE_S
        await trio.sleep(REFRESH_EVERY_S)


async def withdraw(host: IHost, bootstrap: PeerInfo, namespace: str) -> None:
    """Best-effort unregistration on shutdown, so the target forgets us at once (not after the TTL).

    Unregister has no response in the protocol, so we confirm with a discover round trip that our
    registration is gone before returning (and before the caller closes the connection).
    """
    client = RendezvousClient(host, bootstrap.peer_id)
    with trio.move_on_after(UNREGISTER_TIMEOUT_S, shield=True) as scope:
        try:
            await client.unregister(namespace)
            while host.get_id() in [p.peer_id for p in (await client.discover(namespace))[0]]:
                await trio.sleep(0.05)
            log.info("unregistered from %s", bootstrap.peer_id)
        except (RendezvousError, BaseLibp2pError, OSError) as exc:
            log.info("could not unregister from %s: %s", bootstrap.peer_id, exc)
    if scope.cancelled_caught:
        log.info(
            "unregistering from %s timed out; the registration expires in %d s", bootstrap.peer_id, REGISTRATION_TTL_S
        )


def _addr_text(raw: bytes) -> str | None:
    try:
        return str(multiaddr.Multiaddr(raw))
    except (ValueError, TypeError, multiaddr.exceptions.Error):
        return None


class RendezvousPoint:
    """The target side: hosts the rendezvous service and reports the drafters registered on it."""

    def __init__(self, host: IHost, namespace: str) -> None:
        self.service = RendezvousService(host)
        self.namespace = namespace

    def registrations(self) -> list[Registration]:
        records = self.service.registrations.get(self.namespace, {})
        now = time.time()
        found = []
        for peer_id, record in list(records.items()):
            if record.expires_at <= now:
                continue
            addrs = tuple(a for a in map(_addr_text, record.addrs) if a is not None)
            found.append(Registration(str(peer_id), addrs))
        return found

    async def watch(self, on_registration: Callable[[Registration], None], on_gone: Callable[[str], None]) -> None:
        """Every WATCH_INTERVAL_S, report each live registration, and each peer whose registration
        expired or was withdrawn since the last look; forever."""
        known: set[str] = set()
        while True:
            live = self.registrations()
            for registration in live:
                on_registration(registration)
            current = {r.peer_id for r in live}
            for peer_id in sorted(known - current):
                on_gone(peer_id)
            known = current
            await trio.sleep(WATCH_INTERVAL_S)
