"""`specmarket drafter redeem`: redeem the wallet's newest voucher on each lane of each operator at
its escrow (DrafterEscrow pays a voucher out of its own lane: each lane is redeemed on its own).

Only the voucher's drafter may redeem it (DrafterEscrow pays the caller, a pull payment), so the key
must be the payout address's. A voucher already redeemed in full is skipped without a transaction
(``skipped``); one that could not be redeemed, for want of gas, for another key or another chain, is
a failure (``error``). Nothing here logs a row: the caller prints or logs each one once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from eth_account import Account

from node.chain import ChainError
from node.chain.contract import connect
from node.chain.deployment import format_ether
from node.chain.escrow import EscrowClient
from node.chain.vouchers import SignedVoucher
from node.drafter.wallet import Wallet
from verifier.errors import SpecmarketError


class RedeemError(SpecmarketError):
    """A voucher could not be redeemed (its row says why)."""


@dataclass(frozen=True)
class Redeemed:
    lane_key: str  # where the wallet keeps the voucher: ``<chain id>:<escrow>:<operator>:<lane>``
    operator: str
    voucher_wei: int  # the voucher's cumulative amount
    paid_wei: int  # this redemption (0: nothing new)
    paid_before_wei: int
    short_wei: int  # what the escrow could not pay now (still owed: redeem again later)
    gas: int = 0
    tx: str = ""  # the redeem transaction's hash
    skipped: str = ""  # why nothing was sent, when that is as it should be (nothing new)
    error: str = ""  # why it could not be redeemed (no gas, another key's voucher, another chain)

    def line(self) -> str:
        head = f"{self.lane_key}: "
        if self.error:
            return head + f"not redeemed: {self.error}"
        if self.skipped:
            return head + self.skipped
        owed = f"; {format_ether(self.short_wei)} still owed" if self.short_wei else ""
        return (
            head + f"redeemed {format_ether(self.paid_wei)} (voucher {format_ether(self.voucher_wei)} in all, "
            f"{format_ether(self.paid_before_wei)} paid before{owed}; gas {self.gas}, tx {self.tx})"
        )


def redeem_all(data_dir: Path, rpc: str, key: bytes) -> list[Redeemed]:
    """Redeem every voucher in the wallet at ``data_dir`` from ``key``'s account (blocking)."""
    w3 = connect(rpc)
    vouchers = Wallet.open(data_dir, None).vouchers()
    return [redeem_one(w3, key, lane_key, signed) for lane_key, signed in vouchers.items()]


def redeem_one(w3, key: bytes, lane_key: str, signed: SignedVoucher, at_least_wei: int = 1) -> Redeemed:
    """Redeem one voucher from ``key``'s account if it pays at least ``at_least_wei`` more than its
    lane paid before (blocking). ``lane_key`` names it in the row."""
    me, v = Account.from_key(key).address, signed.voucher
    row = Redeemed(lane_key, v.operator, v.cumulative_wei, 0, 0, 0)
    if v.drafter != me:
        return replace(row, error=f"the voucher pays {v.drafter}, not this key's {me}")
    if signed.domain.chain_id != w3.eth.chain_id:
        return replace(row, error=f"the voucher is for chain {signed.domain.chain_id}, the RPC's is {w3.eth.chain_id}")
    escrow = EscrowClient(w3, signed.domain.contract)
    paid = escrow.lane(v.operator, v.drafter, v.lane).paid
    if v.cumulative_wei <= paid:
        return replace(row, skipped=f"nothing new: {format_ether(paid)} paid of {format_ether(v.cumulative_wei)}")
    if v.cumulative_wei - paid < at_least_wei:
        unredeemed = format_ether(v.cumulative_wei - paid)
        return replace(row, skipped=f"{unredeemed} unredeemed, below {format_ether(at_least_wei)}")
    try:
        done = escrow.redeem(key, signed)
    except ChainError as exc:
        return replace(row, error=str(exc))
    tx = done.tx
    return Redeemed(lane_key, v.operator, v.cumulative_wei, done.amount, paid, done.short, tx.gas_used, tx.tx_hash)


def redeem_voucher(rpc: str, key_file: Path, lane_key: str, signed: SignedVoucher, at_least_wei: int) -> Redeemed:
    """``redeem_one`` from a key file (the drafter's --redeem-above; blocking)."""
    from node.chain.keys import read_key

    return redeem_one(connect(rpc), read_key(key_file), lane_key, signed, at_least_wei)
