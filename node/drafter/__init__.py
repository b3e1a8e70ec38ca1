"""The drafter peer: registers on a target's rendezvous point and drafts tokens for its jobs.

Drafters post no bond and are never slashed. ``STRATEGIES`` are the honest one and the hostile
behaviours used by tests and demos; none of them can change the target's output.
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "DrafterConfig": "node.drafter.config",
    "DrafterNode": "node.drafter.peer",
    "ProtocolViolation": "node.drafter.peer",
    "DEFAULT_SLOW_MS": "node.drafter.strategies",
    "STRATEGIES": "node.drafter.strategies",
}
__all__ = sorted(EXPORTS)
__getattr__ = lazy_exports(__name__, EXPORTS)
