"""Clients of a target node: `ask` over HTTP (OpenAI-compatible) or libp2p, with the answer's
receipt checked before it is shown or saved."""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.client.ask": ("AskConfig", "ask", "check_receipt"),
    "node.client.http": ("ClientError", "complete", "http_json", "stream_chat", "stream_completion"),
    "node.client.p2p": ("AskFailed", "ask_p2p"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
