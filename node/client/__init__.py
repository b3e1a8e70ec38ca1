"""Clients of a target node: `ask` over HTTP (OpenAI-compatible) or libp2p, with the answer's
receipt checked against what this machine computes (expected.py) and what the chain says
(chain_view.py, plain JSON-RPC) before it is saved."""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.client.ask": ("AskConfig", "ReceiptReport", "ask", "check_receipt", "verify_receipt"),
    "node.client.chain_view": ("ChainUnreachable", "ChainView"),
    "node.client.expected": ("Expected", "expect"),
    "node.client.http": ("ClientError", "complete", "http_json", "stream_chat", "stream_completion"),
    "node.client.p2p": ("AskFailed", "ask_p2p"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
