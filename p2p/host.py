"""libp2p hosts for specmarket: Noise as the only security transport, identity persisted on disk.

py-libp2p's default host also accepts ``/plaintext/2.0.0`` (and secio, TLS) peers; we pass
``sec_opt`` with Noise alone, so a peer that cannot speak Noise never gets a connection.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import multiaddr
from libp2p import new_host
from libp2p.abc import IHost
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.keystore import FileSystemKeyStore
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport

from p2p.messages import DEFAULT_LISTEN
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

KEYS_SUBDIR = "keys"
IDENTITY_NAME = "identity"
MAX_CONNECTIONS = 256


class InvalidAddress(SpecmarketError):
    """A multiaddr that does not parse, or lacks the /p2p/<peer id> a dial needs."""


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
    """No auto-dialing: py-libp2p's default keeps dialing every peer in the peerstore until it
    holds 50-200 connections. A specmarket node dials only on purpose (a job, a registration)."""
    return ConnectionConfig(
        min_connections=0, low_watermark=0, high_watermark=MAX_CONNECTIONS - 32, max_connections=MAX_CONNECTIONS
    )


def make_host(key_pair: KeyPair) -> IHost:
    """A TCP host whose only security transport is Noise (XX handshake, X25519 static key)."""
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    return new_host(key_pair=key_pair, sec_opt={NOISE_PROTOCOL_ID: noise}, connection_config=connection_config())


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


@asynccontextmanager
async def running_host(data_dir: Path, listen: str = DEFAULT_LISTEN) -> AsyncIterator[IHost]:
    """Start a Noise-only host with the persisted identity, listening on ``listen``."""
    host = make_host(load_identity(data_dir))
    async with host.run(listen_addrs=[parse_listen(listen)]):
        log.info("peer %s listening on %s", host.get_id(), ", ".join(peer_addrs(host)))
        yield host
