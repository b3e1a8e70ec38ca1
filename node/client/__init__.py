"""Clients of a target node: `ask` over HTTP (OpenAI-compatible) or libp2p, with the answer's
receipt checked before it is shown or saved."""

from node.client.ask import AskConfig, ask, check_receipt
from node.client.http import ClientError, complete, http_json, stream_completion
from node.client.p2p import AskFailed, ask_p2p

__all__ = [
    "AskConfig",
    "AskFailed",
    "ClientError",
    "ask",
    "ask_p2p",
    "check_receipt",
    "complete",
    "http_json",
    "stream_completion",
]
