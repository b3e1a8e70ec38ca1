"""The operator's chain side: a local Anvil chain, the SpecmarketBond contract, EIP-712 receipts,
challenges and referees (docs/design.md §3, docs/chain.md, contracts/README.md).

Only the target operator is bonded; drafters never appear here.
"""

from verifier.errors import SpecmarketError
from verifier.exports import lazy_exports


class ChainError(SpecmarketError):
    """A chain that does not answer, a missing deployment, a reverted transaction, a bad receipt."""


EXPORTS = {
    "bond_client": "node.chain.admin",
    "chain_status": "node.chain.admin",
    "deploy_fresh": "node.chain.admin",
    "open_referee": "node.chain.admin",
    "run_challenge": "node.chain.admin",
    "AnvilProcess": "node.chain.anvil",
    "ensure_anvil": "node.chain.anvil",
    "challenge_receipt": "node.chain.challenger",
    "Cheat": "node.chain.cheat",
    "BondClient": "node.chain.client",
    "ChainRevert": "node.chain.client",
    "ChallengeStatus": "node.chain.client",
    "connect": "node.chain.client",
    "deploy": "node.chain.client",
    "ChainConfig": "node.chain.config",
    "ChallengeConfig": "node.chain.config",
    "DeployConfig": "node.chain.config",
    "RefereeConfig": "node.chain.config",
    "BondConfig": "node.chain.deployment",
    "Deployment": "node.chain.deployment",
    "load_or_create_key": "node.chain.keys",
    "read_key": "node.chain.keys",
    "write_key": "node.chain.keys",
    "Operator": "node.chain.operator",
    "OperatorConfig": "node.chain.operator",
    "open_operator": "node.chain.operator",
    "Receipt": "node.chain.receipts",
    "ReceiptError": "node.chain.receipts",
    "RequestSpec": "node.chain.receipts",
    "SignedReceipt": "node.chain.receipts",
    "Referee": "node.chain.referee",
}
__all__ = sorted(["ChainError", *EXPORTS])
__getattr__ = lazy_exports(__name__, EXPORTS)
