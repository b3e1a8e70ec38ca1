"""libp2p hosts for specmarket: Noise as the only security transport, identity persisted on disk.

py-libp2p's default host also accepts ``/plaintext/2.0.0`` (and secio, TLS) peers; we pass
``sec_opt`` with Noise alone, so a peer that cannot speak Noise never gets a connection.

A specmarket host dials only on purpose (a registration, a client's request): py-libp2p's
auto-connector, which dials every peer in the peerstore, is switched off (``NoAutoDial``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import multiaddr
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.keystore import FileSystemKeyStore
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.network.auto_connector import AutoConnector
from libp2p.network.config import ConnectionConfig
from libp2p.network.swarm import Swarm
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID

from p2p.messages import DEFAULT_LISTEN
from p2p.secure import CancelSafeNoise
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

KEYS_SUBDIR = "keys"
IDENTITY_NAME = "identity"
MAX_CONNECTIONS = 256
PORT_FILE = "listen_port"  # the TCP port of the last run: a restarted node keeps its multiaddr
MAX_PORT_FILE_BYTES = 16


class InvalidAddress(SpecmarketError):
    """A multiaddr that does not parse, or lacks the /p2p/<peer id> a dial needs."""


class ListenFailed(SpecmarketError):
    """A listen address that cannot be bound (the port is taken, or the IP is not this machine's)."""


def load_identity(data_dir: Path) -> KeyPair:
    """The node's Ed25519 identity from ``data_dir/keys``, created (mode 0600) on first start."""
    store = FileSystemKeyStore(Path(data_dir) / KEYS_SUBDIR)
    if store.has(IDENTITY_NAME):
        return store.get(IDENTITY_NAME)
    from libp2p.crypto.ed25519 import create_new_key_pair

    key_pair = create_new_key_pair()
    store.put(IDENTITY_NAME, key_pair)
    os.chmod(store.directory / f"{IDENTITY_NAME}.key", 0o600)  # a private key: owner-only
    log.info("created a new peer identity in %s", store.directory)
    return key_pair


def connection_config() -> ConnectionConfig:
    """Connection limits; no connection floor to keep (py-libp2p's default keeps 50)."""
    return ConnectionConfig(
        min_connections=0, low_watermark=0, high_watermark=MAX_CONNECTIONS - 32, max_connections=MAX_CONNECTIONS
    )


class NoAutoDial(AutoConnector):
    """py-libp2p's auto-connector, never dialing. The stock one aims at the midpoint of the low and
    high watermarks (112 connections here, whatever ``low_watermark`` says), so every 30 s and after
    each disconnect it dialed each peer left in the peerstore: drafters that had left, clients that
    had asked once (their identify addresses stay two hours), each dial four TCP attempts logged at
    ERROR by py-libp2p."""

    async def maybe_connect(self) -> None:
        return None


def make_host(key_pair: KeyPair) -> IHost:
    """A TCP host whose only security transport is Noise (XX handshake, X25519 static key), its
    writes atomic (``CancelSafeNoise``), that never dials a peer on its own (``NoAutoDial``)."""
    noise = CancelSafeNoise(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    host = new_host(key_pair=key_pair, sec_opt={NOISE_PROTOCOL_ID: noise}, connection_config=connection_config())
    network = host.get_network()
    if isinstance(network, Swarm):
        network.auto_connector = NoAutoDial(network)
    return host


def parse_listen(text: str) -> multiaddr.Multiaddr:
    try:
        return multiaddr.Multiaddr(text)
    except (ValueError, TypeError, multiaddr.exceptions.Error) as exc:
        raise InvalidAddress(f"cannot parse listen address {text!r}: {exc}") from exc


def parse_peer_addr(text: str) -> PeerInfo:
    """A dialable peer address such as /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW..."""
    try:
        return info_from_p2p_addr(multiaddr.Multiaddr(text))
    except (ValueError, TypeError, multiaddr.exceptions.Error) as exc:
        raise InvalidAddress(f"{text!r} is not a peer multiaddr ending in /p2p/<peer id>: {exc}") from exc


def peer_addrs(host: IHost) -> list[str]:
    """The host's listen addresses with its /p2p/ suffix, ready to hand to other peers."""
    own = str(host.get_id())
    return [a if a.endswith(own) else f"{a}/p2p/{own}" for a in map(str, host.get_addrs())]


def _tcp_endpoint(addr: multiaddr.Multiaddr) -> tuple[str, int] | None:
    """(ip, port) of an /ip4|ip6/<ip>/tcp/<port>[/p2p/<id>] address; None for any other shape."""
    names = [p.name for p in addr.protocols()]
    if names[2:] not in ([], ["p2p"]) or names[:1] not in (["ip4"], ["ip6"]) or names[1:2] != ["tcp"]:
        return None
    return addr.value_for_protocol(names[0]), int(addr.value_for_protocol("tcp"))


def _bind_error(ip: str, port: int) -> OSError | None:
    """Why ``ip:port`` cannot be bound now (None: it can). SO_REUSEADDR, as the listener binds."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError as exc:
            return exc
    return None


def _kept_port(data_dir: Path) -> int | None:
    try:
        with open(Path(data_dir) / PORT_FILE, "rb") as f:
            port = int(f.read(MAX_PORT_FILE_BYTES))
    except (OSError, ValueError):
        return None
    return port if 0 < port < 1 << 16 else None


def _keep_port(data_dir: Path, host: IHost) -> None:
    ports = [e[1] for e in map(_tcp_endpoint, host.get_addrs()) if e is not None]
    if not ports or ports[0] == _kept_port(data_dir):
        return
    path = Path(data_dir) / PORT_FILE
    try:
        path.with_suffix(".tmp").write_text(f"{ports[0]}\n")
        path.with_suffix(".tmp").replace(path)
    except OSError as exc:  # the node serves anyway; only its next run may get another port
        log.warning("cannot keep the listen port in %s: %s", path, exc)


def listen_address(data_dir: Path, listen: str) -> multiaddr.Multiaddr:
    """``listen`` checked for binding. Where it asks for TCP port 0 (any free port), the port of
    the last run (kept in ``data_dir``) if it is free: peers that knew the node still reach it."""
    addr = parse_listen(listen)
    endpoint = _tcp_endpoint(addr)
    if endpoint is None:
        return addr
    ip, port = endpoint
    if port == 0:
        kept = _kept_port(data_dir)
        if kept is None:
            return addr
        if (taken := _bind_error(ip, kept)) is None:
            return multiaddr.Multiaddr(f"/{'ip6' if ':' in ip else 'ip4'}/{ip}/tcp/{kept}")
        log.warning("port %d of the last run is taken (%s); listening on a fresh port", kept, taken.strerror)
    elif (err := _bind_error(ip, port)) is not None:
        raise ListenFailed(f"cannot listen on {listen}: {err.strerror or err}")
    return addr


@asynccontextmanager
async def running_host(data_dir: Path, listen: str = DEFAULT_LISTEN) -> AsyncIterator[IHost]:
    """Start a Noise-only host with the persisted identity, listening on ``listen`` (port 0: the
    port of the last run if it is free, ``listen_address``); the port is kept for the next run."""
    addr = listen_address(data_dir, listen)
    host = make_host(load_identity(data_dir))
    async with host.run(listen_addrs=[addr]):
        if not host.get_addrs():  # py-libp2p logs a failed listen and carries on without an address
            raise ListenFailed(f"cannot listen on {addr}")
        _keep_port(data_dir, host)
        log.info("peer %s listening on %s", host.get_id(), ", ".join(peer_addrs(host)))
        yield host
