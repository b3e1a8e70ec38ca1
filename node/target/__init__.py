"""The target node: serves the target model, asks drafter peers for drafts, verifies every token.

``TargetNode`` runs a libp2p host (rendezvous point, generation protocol), the drafting market and
the OpenAI-compatible HTTP API on one trio loop; ``Engine`` runs jobs (one KV cache per job on
shared weights) and signs a receipt for every answer when the node is bonded.
"""

from node.target.config import TargetConfig
from node.target.engine import CompletionRequest, CompletionResult, Engine
from node.target.http_api import build_app, serve_http
from node.target.market import MarketDrafting
from node.target.node import TargetNode
from node.target.rounds import MarketProposer, RemoteSession

__all__ = [
    "CompletionRequest",
    "CompletionResult",
    "Engine",
    "MarketDrafting",
    "MarketProposer",
    "RemoteSession",
    "TargetConfig",
    "TargetNode",
    "build_app",
    "serve_http",
]
