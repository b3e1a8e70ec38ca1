"""The target node: serves the target model, asks drafter peers for drafts, verifies every token.

``TargetNode`` runs a libp2p host (rendezvous point, generation protocol), the drafting market and
the OpenAI-compatible HTTP API on one trio loop; ``Engine`` runs jobs (one KV cache per job on
shared weights) and signs a receipt for every answer when the node is bonded.
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "TargetConfig": "node.target.config",
    "CompletionRequest": "node.target.engine",
    "CompletionResult": "node.target.engine",
    "Engine": "node.target.engine",
    "build_app": "node.target.http_api",
    "serve_http": "node.target.http_api",
    "MarketDrafting": "node.target.market",
    "TargetNode": "node.target.node",
    "MarketProposer": "node.target.rounds",
    "RemoteSession": "node.target.rounds",
}
__all__ = sorted(EXPORTS)
__getattr__ = lazy_exports(__name__, EXPORTS)
