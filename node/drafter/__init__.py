"""The drafter peer: registers on a target's rendezvous point and drafts tokens for its jobs.

Drafters post no bond and are never slashed. ``STRATEGIES`` are the honest one and the hostile
behaviours used by tests and demos; none of them can change the target's output.
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.drafter.config": ("DrafterConfig",),
    "node.drafter.peer": ("DrafterNode",),
    "node.drafter.session": ("DraftSession", "ProtocolViolation"),
    "node.drafter.strategies": ("DEFAULT_SLOW_MS", "STRATEGIES"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
