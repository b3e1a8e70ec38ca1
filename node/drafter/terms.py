"""What a paying ``open`` promises a drafter, as the drafter keeps it: who pays, from where, how much.

An open (p2p.messages.Open) names the DrafterEscrow (chain id and address), the operator that signs
the vouchers, the operator's lane for this drafter, the price per accepted draft token and the most
this job can pay. The drafter's wallet counts what it is owed per *operator account*, the key
(chain id, escrow, operator address): every node, peer id and ledger of one operator adds to the
same account, so a restarted target, a replica or a fresh peer identity never starts the drafter's
reckoning from zero. Within an account, each lane is its own cumulative total (DrafterEscrow pays a
voucher from its own lane only).
"""

from __future__ import annotations

from dataclasses import dataclass

from eth_utils import to_checksum_address

from p2p.messages import Open


@dataclass(frozen=True)
class Terms:
    chain_id: int
    escrow: str  # checksummed
    operator: str  # checksummed: the address that signs this job's voucher
    lane: int
    price_wei: int
    max_pay_wei: int  # the most this job can pay the drafter

    @classmethod
    def of(cls, msg: Open) -> Terms | None:
        """The terms of a paying open; None for an unpaid one (price 0)."""
        if not msg.price_wei:
            return None
        return cls(
            msg.chain_id,
            to_checksum_address(msg.escrow),
            to_checksum_address(msg.operator),
            msg.lane,
            msg.price_wei,
            msg.max_pay_wei,
        )

    @property
    def account(self) -> str:
        """The wallet's key for everything this operator owes at this escrow."""
        return account_key(self.chain_id, self.escrow, self.operator)


def account_key(chain_id: int, escrow: str, operator: str) -> str:
    """``<chain id>:<escrow>:<operator>``, addresses checksummed."""
    return f"{chain_id}:{to_checksum_address(escrow)}:{to_checksum_address(operator)}"
