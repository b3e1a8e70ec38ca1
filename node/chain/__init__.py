"""The operator's chain side: a local Anvil chain, the SpecmarketBond contract, EIP-712 receipts,
challenges and referees (DESIGN §3, contracts/README.md).

Only the target operator is bonded; drafters never appear here.
"""

from verifier.errors import SpecmarketError


class ChainError(SpecmarketError):
    """A chain that does not answer, a missing deployment, a reverted transaction, a bad receipt."""
