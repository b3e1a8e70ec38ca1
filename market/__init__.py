"""Drafter registry, selection policy and accepted-token ledger.

Holds no slashing logic: drafters risk only their effort. The market decides whom the target asks
for drafts (``Policy.select``), whose arrived draft it verifies (``Policy.rank``), benches drafters
that time out or never match, and keeps score: live stats in memory (``Registry``), accepted
tokens per drafter on disk (``Ledger``). Pure Python: no network, no models, no money.
"""

from market.ledger import Ledger, LedgerEntry
from market.policy import DEFAULT_DEADLINE_MS, Policy, PolicyConfig
from market.registry import DrafterInfo, DrafterStats, MarketError, Registry

__all__ = [
    "DEFAULT_DEADLINE_MS",
    "DrafterInfo",
    "DrafterStats",
    "Ledger",
    "LedgerEntry",
    "MarketError",
    "Policy",
    "PolicyConfig",
    "Registry",
]
