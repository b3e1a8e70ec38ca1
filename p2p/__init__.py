"""libp2p hosts, protocol ids, framing, message schemas and discovery.

Knows nothing about models or money. Everything read from a peer is bounded and validated here
(``p2p.messages.decode``) before any other package sees it.
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "Registration": "p2p.discovery",
    "RendezvousPoint": "p2p.discovery",
    "announce": "p2p.discovery",
    "drafter_namespace": "p2p.discovery",
    "withdraw": "p2p.discovery",
    "FrameStream": "p2p.framing",
    "StreamFailed": "p2p.framing",
    "InvalidAddress": "p2p.host",
    "make_host": "p2p.host",
    "parse_peer_addr": "p2p.host",
    "peer_addrs": "p2p.host",
    "running_host": "p2p.host",
    "DEFAULT_LISTEN": "p2p.messages",
    "DRAFT_PROTOCOL_ID": "p2p.messages",
    "GENERATE_PROTOCOL_ID": "p2p.messages",
    "MAX_FRAME_BYTES": "p2p.messages",
    "Advance": "p2p.messages",
    "Chunk": "p2p.messages",
    "Done": "p2p.messages",
    "Draft": "p2p.messages",
    "Error": "p2p.messages",
    "InvalidMessage": "p2p.messages",
    "Open": "p2p.messages",
    "Request": "p2p.messages",
    "decode": "p2p.messages",
    "encode": "p2p.messages",
}
__all__ = sorted(EXPORTS)
__getattr__ = lazy_exports(__name__, EXPORTS)
