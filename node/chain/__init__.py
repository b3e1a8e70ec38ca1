"""The operator's chain side: a local Anvil chain, the SpecmarketBond contract, EIP-712 receipts,
challenges and referees (docs/design.md §3, docs/chain.md, contracts/README.md).

Only the target operator is bonded; drafters never appear here.
"""

from verifier.errors import SpecmarketError


class ChainError(SpecmarketError):
    """A chain that does not answer, a missing deployment, a reverted transaction, a bad receipt."""


# the public API (after ChainError, which every module below imports from here)
from node.chain.admin import ChainConfig, ChallengeConfig, DeployConfig, RefereeConfig  # noqa: E402
from node.chain.anvil import AnvilProcess, ensure_anvil  # noqa: E402
from node.chain.challenger import challenge_receipt  # noqa: E402
from node.chain.cheat import Cheat  # noqa: E402
from node.chain.client import BondClient, ChainRevert, ChallengeStatus, connect, deploy  # noqa: E402
from node.chain.deployment import BondConfig, Deployment  # noqa: E402
from node.chain.keys import load_or_create_key, read_key, write_key  # noqa: E402
from node.chain.operator import Operator, OperatorConfig, open_operator  # noqa: E402
from node.chain.receipts import Receipt, ReceiptError, RequestSpec, SignedReceipt  # noqa: E402
from node.chain.referee import Referee  # noqa: E402

__all__ = [
    "AnvilProcess",
    "BondClient",
    "BondConfig",
    "ChainConfig",
    "ChainError",
    "ChainRevert",
    "ChallengeConfig",
    "ChallengeStatus",
    "Cheat",
    "DeployConfig",
    "Deployment",
    "Operator",
    "OperatorConfig",
    "Receipt",
    "ReceiptError",
    "Referee",
    "RefereeConfig",
    "RequestSpec",
    "SignedReceipt",
    "challenge_receipt",
    "connect",
    "deploy",
    "ensure_anvil",
    "load_or_create_key",
    "open_operator",
    "read_key",
    "write_key",
]
