"""libp2p hosts, protocol ids, framing, message schemas and discovery.

Knows nothing about models or money. Everything read from a peer is bounded and validated here
(``p2p.messages.decode``) before any other package sees it.
"""

from p2p.discovery import Registration, RendezvousPoint, announce, drafter_namespace, withdraw
from p2p.framing import FrameStream, StreamFailed
from p2p.host import DEFAULT_LISTEN, InvalidAddress, make_host, parse_peer_addr, peer_addrs, running_host
from p2p.messages import (
    DRAFT_PROTOCOL_ID,
    GENERATE_PROTOCOL_ID,
    MAX_FRAME_BYTES,
    Advance,
    Chunk,
    Done,
    Draft,
    Error,
    InvalidMessage,
    Open,
    Request,
    decode,
    encode,
)

__all__ = [
    "DEFAULT_LISTEN",
    "DRAFT_PROTOCOL_ID",
    "GENERATE_PROTOCOL_ID",
    "MAX_FRAME_BYTES",
    "Advance",
    "Chunk",
    "Done",
    "Draft",
    "Error",
    "FrameStream",
    "InvalidAddress",
    "InvalidMessage",
    "Open",
    "Registration",
    "RendezvousPoint",
    "Request",
    "StreamFailed",
    "announce",
    "decode",
    "drafter_namespace",
    "encode",
    "make_host",
    "parse_peer_addr",
    "peer_addrs",
    "running_host",
    "withdraw",
]
