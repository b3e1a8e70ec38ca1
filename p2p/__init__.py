"""libp2p hosts, protocol ids, framing, message schemas and discovery.

Knows nothing about models or money. Everything read from a peer is bounded and validated here
(``p2p.messages.decode``) before any other package sees it; JSON and TOML from outside the process
(HTTP bodies, receipts, config files) have their nesting bounded before any parser sees them
(``p2p.safe_json``: ``loads``, ``check_depth``).
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "p2p.discovery": ("Registration", "RendezvousPoint", "announce", "drafter_namespace", "withdraw"),
    "p2p.framing": ("FrameStream", "StreamEnded", "StreamFailed"),
    "p2p.host": ("InvalidAddress", "make_host", "parse_peer_addr", "peer_addrs", "running_host"),
    "p2p.messages": (
        "DEFAULT_LISTEN",
        "DRAFT_PROTOCOL_ID",
        "GENERATE_PROTOCOL_ID",
        "MAX_FRAME_BYTES",
        "Advance",
        "Chunk",
        "Done",
        "Draft",
        "Error",
        "InvalidMessage",
        "Open",
        "Request",
        "decode",
        "encode",
    ),
    "p2p.safe_json": ("MAX_JSON_DEPTH", "TooDeep", "check_depth", "nesting_depth"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
