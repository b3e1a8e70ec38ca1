"""The chain side: a local Anvil chain, the SpecmarketBond contract, EIP-712 receipts, challenges
and referees (docs/design.md §3, docs/chain.md, contracts/README.md), and the DrafterEscrow that
pays drafters' vouchers.

Only the target operator is bonded; a drafter appears only as the payee of a voucher.
"""

from verifier.errors import SpecmarketError
from verifier.exports import lazy_exports


class ChainError(SpecmarketError):
    """A chain that does not answer, a missing deployment, a reverted transaction, a bad receipt."""


EXPORTS = {
    "node.chain.admin": ("bond_client", "chain_status", "deploy_fresh", "open_referee", "run_challenge"),
    "node.chain.anvil": ("AnvilProcess", "ensure_anvil"),
    "node.chain.challenger": ("challenge_receipt",),
    "node.chain.cheat": ("Cheat",),
    "node.chain.client": ("BondClient", "ChainRevert", "ChallengeStatus", "connect", "deploy"),
    "node.chain.config": ("ChainConfig", "ChallengeConfig", "DeployConfig", "RefereeConfig"),
    "node.chain.deployment": ("BondConfig", "Deployment"),
    "node.chain.escrow": ("EscrowClient", "deploy_escrow"),
    "node.chain.paymaster": ("Paymaster", "PaymentConfig"),
    "node.chain.vouchers": ("SignedVoucher", "Voucher", "VoucherError", "sign_voucher"),
    "node.chain.keys": ("load_or_create_key", "read_key", "write_key"),
    "node.chain.operator": ("Operator", "OperatorConfig", "open_operator"),
    "node.chain.receipts": ("Receipt", "ReceiptError", "RequestSpec", "SignedReceipt"),
    "node.chain.referee": ("Referee",),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
__all__ = sorted(["ChainError", *__all__])
