"""Clients of a target node: `ask` over HTTP (OpenAI-compatible) or libp2p, with the answer's
receipt checked before it is shown or saved."""

from verifier.exports import lazy_exports

EXPORTS = {
    "AskConfig": "node.client.ask",
    "ask": "node.client.ask",
    "check_receipt": "node.client.ask",
    "ClientError": "node.client.http",
    "complete": "node.client.http",
    "http_json": "node.client.http",
    "stream_completion": "node.client.http",
    "AskFailed": "node.client.p2p",
    "ask_p2p": "node.client.p2p",
}
__all__ = sorted(EXPORTS)
__getattr__ = lazy_exports(__name__, EXPORTS)
