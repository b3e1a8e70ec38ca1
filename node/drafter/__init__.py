"""The drafter peer: registers on a target's rendezvous point and drafts tokens for its jobs.

Drafters post no bond and are never slashed. ``STRATEGIES`` are the honest one and the hostile
behaviours used by tests and demos; none of them can change the target's output.
"""

from node.drafter.peer import DrafterConfig, DrafterNode, ProtocolViolation
from node.drafter.strategies import DEFAULT_SLOW_MS, STRATEGIES

__all__ = ["DEFAULT_SLOW_MS", "STRATEGIES", "DrafterConfig", "DrafterNode", "ProtocolViolation"]
