"""Drafter discovery through a libp2p rendezvous point hosted by the target.

Drafters register under ``specmarket/drafters/<tokenizer fingerprint>`` so that only peers with
the target's vocabulary are found; a drafter needs nothing but the target's (bootstrap) multiaddr.
The rendezvous protocol only lets a peer register itself, so a registration cannot name a victim.

The point runs on the trio loop that also serves HTTP and drafting, and anyone can register, so
every registration is bounded before it is stored (``BoundedRendezvousService``): our namespace
only, MAX_ADDRS_PER_REGISTRATION addresses of at most MAX_ADDR_BYTES (parsed once, here), a TTL of
at most MAX_TTL_S, MAX_REGISTRATIONS in all, each request within MAX_MESSAGE_BYTES and
REQUEST_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

import multiaddr
import trio
from google.protobuf.message import DecodeError
from libp2p.abc import IHost, INetStream
from libp2p.discovery.rendezvous import RendezvousClient, RendezvousError, RendezvousService
from libp2p.discovery.rendezvous.messages import create_discover_response_message, create_register_response_message
from libp2p.discovery.rendezvous.pb.rendezvous_pb2 import Message
from libp2p.discovery.rendezvous.service import RegistrationRecord
from libp2p.exceptions import BaseLibp2pError
from libp2p.io.exceptions import IncompleteReadError
from libp2p.network.swarm import Swarm
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import encode_varint_prefixed, read_varint_prefixed_bytes_limited

log = logging.getLogger(__name__)

NAMESPACE_PREFIX = "specmarket/drafters/"
REGISTRATION_TTL_S = 300  # py-libp2p's minimum is 120 s
REFRESH_EVERY_S = REGISTRATION_TTL_S / 3
CONNECT_TIMEOUT_S = 5.0
RETRY_BASE_S = 0.5
RETRY_MAX_S = 30.0
WATCH_INTERVAL_S = 0.2
UNREGISTER_TIMEOUT_S = 2.0  # dialing again, unregistering and confirming it, on shutdown
REDIAL_ADDR_TTL_S = 60  # the point's addresses, kept this long for that dial
REGISTER_TIMEOUT_S = 10.0  # a rendezvous point must answer a registration this soon
CONNECTED_POLL_S = 1.0  # how often a registered peer checks that it is still connected to the point
REREGISTER_MIN_GAP_S = 2.0  # at most one registration this often, whatever the connection does
RELOCATE_AFTER = 2  # failed registrations in a row before asking where the point is now

# The rendezvous point's caps. Honest drafters register a handful of bare transport addresses with
# REGISTRATION_TTL_S; everything past that is load an attacker chose.
MAX_ADDRS_PER_REGISTRATION = 16  # more are dropped (a multi-homed host may list many interfaces)
MAX_ADDR_BYTES = 512  # a binary multiaddr; /dns4/<253 chars>/tcp/<port> is ~265
MAX_TTL_S = 3 * REGISTRATION_TTL_S  # a longer TTL is granted this long (the reply says so)
MAX_REGISTRATIONS = 256  # in all; when full, expired ones go first, then newcomers are refused
MAX_MESSAGE_BYTES = 64 * 1024  # one request; py-libp2p reads up to 4 MiB (~400k addresses)
REQUEST_TIMEOUT_S = 10.0  # a request must arrive this soon after the stream opens (or the last reply)
REPLY_TIMEOUT_S = 10.0
MAX_REQUESTS_PER_STREAM = 8  # py-libp2p's client sends one per stream
CLOSE_TIMEOUT_S = 1.0
HANG_UP_AFTER_S = 2 * UNREGISTER_TIMEOUT_S  # a peer whose registration ended is disconnected this much later


def drafter_namespace(fingerprint: str) -> str:
    return NAMESPACE_PREFIX + fingerprint


@dataclass(frozen=True)
class Registration:
    peer_id: str
    addrs: tuple[str, ...]


Relocate = Callable[[], Awaitable[PeerInfo | None]]  # where the bootstrap peer is now, if known


@dataclass
class PointLink:
    """What a drafter knows of its rendezvous point, shared by ``announce`` and ``withdraw``: a point
    that stops answering after a registration is gone, which is said once, at INFO."""

    registered: bool = False  # it registered at least once (a failure before that is a WARNING)
    gone: str = ""  # why the point stopped answering after a registration ("": it answers)

    def failed(self, peer_id: ID, exc: BaseException, delay: float) -> None:
        """A registration failed; log it (once at INFO for a point that is gone)."""
        why = str(exc) or type(exc).__name__
        if not self.registered:  # it never answered: a wrong address, or it is not up yet
            log.warning("registering with %s failed (%s); retrying in %.1f s", peer_id, why, delay)
        elif not self.gone:
            self.gone = why
            log.info("%s is gone (%s); registering again once it answers", peer_id, why)
        else:
            log.debug("registering with %s failed (%s); retrying in %.1f s", peer_id, why, delay)


_QUIET = contextvars.ContextVar("specmarket_quiet_libp2p", default=False)


class _QuietLibp2p(logging.Filter):
    """In a task that talks to a point that may be gone, py-libp2p's records become DEBUG records,
    shown only with -v: the task's own line says what failed, once."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _QUIET.get() or record.levelno <= logging.DEBUG:
            return True
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger().isEnabledFor(logging.DEBUG)


_QUIET_FILTER = _QuietLibp2p()


@contextlib.contextmanager
def _quiet_libp2p() -> Iterator[None]:
    """py-libp2p's log records from this task (and the tasks it starts) at DEBUG, for the block."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("libp2p") and isinstance(logger, logging.Logger) and _QUIET_FILTER not in logger.filters:
            logger.addFilter(_QUIET_FILTER)
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


async def _register_once(host: IHost, bootstrap: PeerInfo, namespace: str) -> None:
    network = host.get_network()
    if isinstance(network, Swarm):  # we retry on our own schedule: py-libp2p's 60 s dial block is in the way
        network.unblock_peer(bootstrap.peer_id)
    with trio.fail_after(CONNECT_TIMEOUT_S):
        await host.connect(bootstrap)
    with trio.fail_after(REGISTER_TIMEOUT_S):
        await RendezvousClient(host, bootstrap.peer_id).register(namespace, ttl=REGISTRATION_TTL_S)


async def _until_refresh_or_dropped(host: IHost, peer_id: ID) -> bool:
    """Until the registration is due for a refresh (False), or the connection to the rendezvous
    point drops (True: it restarted, and a restarted point has forgotten every registration, or it
    is gone)."""
    with trio.move_on_after(REFRESH_EVERY_S):
        await trio.sleep(REREGISTER_MIN_GAP_S)
        while host.get_network().get_connections(peer_id):
            await trio.sleep(CONNECTED_POLL_S)
        log.debug("lost the connection to %s; registering again", peer_id)
        return True
    return False


async def _moved(host: IHost, relocate: Relocate, bootstrap: PeerInfo) -> PeerInfo | None:
    """The bootstrap peer's new addresses (same peer id) if ``relocate`` knows of others; they
    replace the old ones in the peerstore (py-libp2p dials one TCP address of a peer, not each)."""
    found = await relocate()
    if found is None or found.peer_id != bootstrap.peer_id or {*map(str, found.addrs)} <= {*map(str, bootstrap.addrs)}:
        return None
    log.info("%s moved: now at %s", bootstrap.peer_id, ", ".join(map(str, found.addrs)))
    host.get_peerstore().clear_addrs(bootstrap.peer_id)
    return found


async def announce(
    host: IHost,
    bootstrap: PeerInfo,
    namespace: str,
    *,
    relocate: Relocate | None = None,
    link: PointLink | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Register with the rendezvous point and keep the registration fresh, forever.

    Retries with exponential backoff while the bootstrap peer is unreachable, and registers again
    as soon as the connection to it drops (the target restarted). After RELOCATE_AFTER failures in
    a row, ``relocate()`` (if given) may say where the peer is now (same peer id, other addresses).
    Signals ``task_status.started()`` after the first successful registration. ``link`` (shared
    with ``withdraw``) records whether the point is gone.
    """
    link = link if link is not None else PointLink()
    delay, failures, dropped = RETRY_BASE_S, 0, False
    while True:
        try:
            with _quiet_libp2p() if link.registered else contextlib.nullcontext():
                await _register_once(host, bootstrap, namespace)
        except (trio.TooSlowError, RendezvousError, BaseLibp2pError, OSError, ValueError) as exc:
            failures += 1
            moved = None
            if relocate is not None and failures >= RELOCATE_AFTER:
                moved = await _moved(host, relocate, bootstrap)
            if moved is not None:  # try the new address at once
                bootstrap, delay = moved, RETRY_BASE_S
                continue
            link.failed(bootstrap.peer_id, exc, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        if not link.registered:
            task_status.started()
        again = " again (the connection had dropped)" if dropped else ""
        log.info("registered with %s under %s%s", bootstrap.peer_id, namespace, again)
        link.registered, link.gone = True, ""
        delay, failures = RETRY_BASE_S, 0
        dropped = await _until_refresh_or_dropped(host, bootstrap.peer_id)


async def _redial_if_closed(host: IHost, bootstrap: PeerInfo) -> None:
    """Dial ``bootstrap`` afresh when every connection to it is closed or closing.

    The registration outlives a dropped connection (until its TTL), and a connection whose close is
    still under way stays listed: ``host.connect`` would reuse it, and streams on it fail with
    "No valid connections available".
    """
    network = host.get_network()
    if any(not conn.is_closed for conn in network.get_connections(bootstrap.peer_id)):
        return
    host.get_peerstore().add_addrs(bootstrap.peer_id, bootstrap.addrs, REDIAL_ADDR_TTL_S)
    await network.dial_peer(bootstrap.peer_id)


async def withdraw(host: IHost, bootstrap: PeerInfo, namespace: str, link: PointLink | None = None) -> None:
    """Best-effort unregistration on shutdown, so the target forgets us at once (not after the TTL).

    Unregister has no response in the protocol, so we confirm with a discover round trip that our
    registration is gone before returning (and before the caller closes the connection). A point
    that is gone is said so in one INFO line (none more when ``link`` already said it).
    """
    client = RendezvousClient(host, bootstrap.peer_id)
    said = link is not None and bool(link.gone)
    with trio.move_on_after(UNREGISTER_TIMEOUT_S, shield=True) as scope, _quiet_libp2p():
        try:
            await _redial_if_closed(host, bootstrap)
            await client.unregister(namespace)
            while host.get_id() in [p.peer_id for p in (await client.discover(namespace))[0]]:
                await trio.sleep(0.05)
            log.info("unregistered from %s", bootstrap.peer_id)
        except (RendezvousError, BaseLibp2pError, OSError) as exc:
            (log.debug if said else log.info)("%s is gone (%s); not unregistering", bootstrap.peer_id, exc)
    if scope.cancelled_caught:
        (log.debug if said else log.info)(
            "unregistering from %s timed out; the registration expires in %d s", bootstrap.peer_id, REGISTRATION_TTL_S
        )


def _addr_text(raw: bytes) -> str | None:
    try:
        return str(multiaddr.Multiaddr(raw))
    except (ValueError, TypeError, multiaddr.exceptions.Error):
        return None


def _refusal(status: Message.ResponseStatus.ValueType, why: str) -> Message:
    return create_register_response_message(status, why)


class ParsedRecord(RegistrationRecord):
    """A stored registration with its addresses parsed once, when it was stored."""

    def __init__(self, peer_id: ID, addrs: list[bytes], namespace: str, ttl: int, texts: tuple[str, ...]) -> None:
        super().__init__(peer_id, addrs, namespace, ttl)
        self.registration = Registration(str(peer_id), texts)


class BoundedRendezvousService(RendezvousService):
    """py-libp2p's rendezvous service with every input bounded: it serves ``namespaces`` only (so a
    peer holds at most one registration per namespace, whatever its connections, since the store is
    keyed by the authenticated peer id), keeps the first MAX_ADDRS_PER_REGISTRATION addresses (those
    that parse and fit MAX_ADDR_BYTES), clamps the TTL to ``max_ttl_s``, and holds at most
    ``max_registrations``. When full, expired registrations go first; a live one is never evicted, so
    a newcomer is refused (E_UNAVAILABLE) while a registered peer can always refresh.

    The Sybil limit: peer ids are free, so whoever holds ``max_registrations`` live registrations
    (refreshing each within ``max_ttl_s``) keeps newcomers out until they lapse; it cannot evict
    drafters already registered, nor grow memory or the watch loop's work past the cap.
    """

    def __init__(
        self,
        host: IHost,
        namespaces: Iterable[str],
        *,
        max_registrations: int = MAX_REGISTRATIONS,
        max_ttl_s: int = MAX_TTL_S,
    ) -> None:
        self.namespaces = frozenset(namespaces)
        self.max_registrations, self.max_ttl_s = max_registrations, max_ttl_s
        self.refused_full = 0
        super().__init__(host)  # installs self._handle_stream as the protocol's handler

    def live(self, namespace: str) -> list[ParsedRecord]:
        now = time.time()
        records = self.registrations.get(namespace, {})
        return [r for r in list(records.values()) if isinstance(r, ParsedRecord) and r.expires_at > now]

    def count(self) -> int:
        return sum(map(len, self.registrations.values()))

    async def _handle_stream(self, stream: INetStream) -> None:
        """Up to MAX_REQUESTS_PER_STREAM requests, each read within REQUEST_TIMEOUT_S and
        MAX_MESSAGE_BYTES; anything late, oversized, malformed or of an unknown type resets it."""
        peer_id = stream.muxed_conn.peer_id
        try:
            for _ in range(MAX_REQUESTS_PER_STREAM):
                with trio.fail_after(REQUEST_TIMEOUT_S):
                    try:
                        raw = await read_varint_prefixed_bytes_limited(stream, MAX_MESSAGE_BYTES)
                    except IncompleteReadError as exc:
                        if exc.is_clean_close:
                            break
                        raise
                request = Message.FromString(raw)
                if request.type == Message.UNREGISTER:
                    self._handle_unregister(peer_id, request.unregister)
                    continue
                reply = self._reply(peer_id, request)
                if reply is None:
                    raise ValueError(f"unexpected rendezvous message type {request.type}")
                with trio.fail_after(REPLY_TIMEOUT_S):
                    await stream.write(encode_varint_prefixed(reply.SerializeToString()))
        except (trio.TooSlowError, trio.BrokenResourceError, BaseLibp2pError, DecodeError, OSError, ValueError) as exc:
            log.debug("rendezvous stream from %s reset: %s", peer_id, exc or type(exc).__name__)
            with trio.move_on_after(CLOSE_TIMEOUT_S), contextlib.suppress(BaseLibp2pError):
                await stream.reset()
            return
        with trio.move_on_after(CLOSE_TIMEOUT_S), contextlib.suppress(BaseLibp2pError):
            await stream.close()

    def _reply(self, peer_id: ID, request: Message) -> Message | None:
        if request.type == Message.REGISTER:
            return self._handle_register(peer_id, request.register)
        if request.type == Message.DISCOVER:
            return self._handle_discover(peer_id, request.discover)
        return None

    def _handle_discover(self, peer_id: ID, discover_msg: Message.Discover) -> Message:
        """The asker's own live registration, or none: no more. A drafter needs no list of the
        others (it discovers only to see its own registration gone, ``withdraw``), and py-libp2p's
        answer, every registration of the namespace, made a 60-byte request draw about 2 MiB."""
        if discover_msg.ns not in self.namespaces:  # py-libp2p would create the namespace
            status = Message.ResponseStatus.E_INVALID_NAMESPACE
            return create_discover_response_message([], b"", status, "this point serves other namespaces")
        own = self.registrations.get(discover_msg.ns, {}).get(peer_id)
        found = [own.to_protobuf_register()] if own is not None and own.expires_at > time.time() else []
        return create_discover_response_message(found, b"", Message.ResponseStatus.OK, "OK")

    def _handle_register(self, peer_id: ID, register_msg: Message.Register) -> Message:
        """Validate, trim and store a registration (replacing the peer's previous one)."""
        namespace, peer = register_msg.ns, register_msg.peer
        if namespace not in self.namespaces:
            return _refusal(Message.ResponseStatus.E_INVALID_NAMESPACE, "this point serves other namespaces")
        if peer.id != peer_id.to_bytes():
            return _refusal(Message.ResponseStatus.E_NOT_AUTHORIZED, "a peer can only register itself")
        ttl = min(register_msg.ttl or self.max_ttl_s, self.max_ttl_s)  # unset: the protocol's default, capped
        kept = [(raw, text) for raw in peer.addrs[:MAX_ADDRS_PER_REGISTRATION] if (text := _bounded_addr(raw))]
        if peer.addrs and not kept:
            return _refusal(Message.ResponseStatus.E_INVALID_PEER_INFO, "no usable address")
        store = self.registrations.setdefault(namespace, {})
        if peer_id not in store and not self._has_room():
            self.refused_full += 1
            log.debug("rendezvous full (%d): refused %s", self.max_registrations, peer_id)
            return _refusal(Message.ResponseStatus.E_UNAVAILABLE, "registration limit reached")
        addrs, texts = [raw for raw, _ in kept], tuple(text for _, text in kept)
        store[peer_id] = ParsedRecord(peer_id, addrs, namespace, ttl, texts)
        return create_register_response_message(Message.ResponseStatus.OK, "OK", ttl)

    def _has_room(self) -> bool:
        if self.count() >= self.max_registrations:
            self.cleanup_all_expired()  # expired registrations make room; live ones are never evicted
        return self.count() < self.max_registrations


def _bounded_addr(raw: bytes) -> str | None:
    return _addr_text(raw) if len(raw) <= MAX_ADDR_BYTES else None


class RendezvousPoint:
    """The target side: hosts the rendezvous service and reports the drafters registered on it."""

    def __init__(
        self,
        host: IHost,
        namespace: str,
        *,
        max_registrations: int = MAX_REGISTRATIONS,
        hang_up_after_s: float = HANG_UP_AFTER_S,
    ) -> None:
        self.service = BoundedRendezvousService(host, [namespace], max_registrations=max_registrations)
        self.namespace = namespace
        self.hang_up_after_s = hang_up_after_s

    def registrations(self) -> list[Registration]:
        """The live registrations, addresses as parsed when each was stored (at most
        MAX_REGISTRATIONS of at most MAX_ADDRS_PER_REGISTRATION addresses each)."""
        return [record.registration for record in self.service.live(self.namespace)]

    def stats(self) -> dict[str, int]:
        """JSON-ready: live registrations, the cap, and newcomers refused because it was reached."""
        live = len(self.service.live(self.namespace))
        return {
            "registrations": live,
            "capacity": self.service.max_registrations,
            "refused_full": self.service.refused_full,
        }

    async def watch(self, on_registration: Callable[[Registration], None], on_gone: Callable[[str], None]) -> None:
        """Every WATCH_INTERVAL_S, report each live registration, and each peer whose registration
        expired or was withdrawn since the last look; forever. A peer whose registration ended is
        disconnected ``hang_up_after_s`` later if it has not registered again (``_hang_up``)."""
        known: set[str] = set()
        async with trio.open_nursery() as nursery:
            while True:
                live = self.registrations()
                for registration in live:
                    on_registration(registration)
                current = {r.peer_id for r in live}
                for peer_id in sorted(known - current):
                    on_gone(peer_id)
                    nursery.start_soon(self._hang_up, peer_id)
                known = current
                await trio.sleep(WATCH_INTERVAL_S)

    async def _hang_up(self, peer_id: str) -> None:
        """Close the connections of a peer no longer registered, once it has had ``hang_up_after_s``
        to finish withdrawing (a drafter confirms its unregistration, then hangs up itself)."""
        await trio.sleep(self.hang_up_after_s)
        if peer_id in {r.peer_id for r in self.registrations()}:
            return
        host = self.service.host
        peer = ID.from_base58(peer_id)
        if not host.get_network().get_connections(peer):
            return
        log.info("closing the connection to %s: its registration ended", peer_id)
        with trio.move_on_after(CLOSE_TIMEOUT_S):
            try:
                await host.disconnect(peer)
            except (BaseLibp2pError, OSError) as exc:
                log.debug("closing the connection to %s failed: %s", peer_id, exc)
