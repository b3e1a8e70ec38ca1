"""The target node: serves the target model, asks drafter peers for drafts, verifies every token.

``TargetNode`` runs a libp2p host (rendezvous point, generation protocol), the drafting market and
the OpenAI-compatible HTTP API (FastAPI on hypercorn) on one trio loop; ``Engine`` runs jobs (one
KV cache per job on shared weights) and signs a receipt for every answer when the node is bonded.
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.target.chat": ("FALLBACK_CHAT_TEMPLATE", "chat_prompt"),
    "node.target.config": ("TargetConfig",),
    "node.target.engine": ("CompletionRequest", "CompletionResult", "Engine"),
    "node.target.http.api": ("build_app", "serve_http"),
    "node.target.market": ("MarketDrafting",),
    "node.target.node": ("TargetNode",),
    "node.target.rounds": ("MarketProposer",),
    "node.target.sessions": ("RemoteSession",),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
