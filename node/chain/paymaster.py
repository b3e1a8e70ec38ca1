"""The operator's side of drafter payments: its DrafterEscrow, its price, and the vouchers it signs.

A bonded target announces ``price_wei`` per accepted draft token in every ``open``; after each job
the market credits the job and signs one cumulative voucher per paid drafter in one ledger
transaction (market.ledger.Ledger.credit_and_pay, with ``Paymaster.pay``), and sends it in the
session's closing ``settle``. Payments come out of the escrow, never the bond.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from eth_account import Account

from market.ledger import Pay
from node.chain import ChainError
from node.chain.deployment import (
    DEFAULT_DRAFTER_PRICE_WEI,
    DEFAULT_ESCROW_DEPOSIT_WEI,
    DEFAULT_ESCROW_FLOOR_WEI,
    format_ether,
)
from node.chain.escrow import EscrowClient, EscrowState
from node.chain.vouchers import Voucher, sign_voucher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PaymentConfig:
    price_wei: int = DEFAULT_DRAFTER_PRICE_WEI
    deposit_wei: int = DEFAULT_ESCROW_DEPOSIT_WEI  # the escrow is topped up to this at start (0: never)
    floor_wei: int = DEFAULT_ESCROW_FLOOR_WEI

    def __post_init__(self) -> None:
        for name in ("price_wei", "deposit_wei", "floor_wei"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ChainError(f"{name} must be a non-negative number of wei, got {value!r}")


class Paymaster:
    """Signs drafters' vouchers for one operator at one escrow."""

    def __init__(self, escrow: EscrowClient, key: bytes, cfg: PaymentConfig, *, underpay: bool = False) -> None:
        self.escrow, self.cfg = escrow, cfg
        self.underpay = underpay  # Cheat.UNDERPAY: every voucher for half the drafter's earnings (tests, demo)
        self._key = key  # never logged
        self.address = Account.from_key(key).address
        self.tag = f"{escrow.domain.chain_id}:{escrow.address}"  # the ledger's escrow key
        self.vouchers_signed = 0
        self._state: EscrowState | None = None  # as last read (refresh): /health never waits for the chain

    @property
    def price_wei(self) -> int:
        return self.cfg.price_wei

    def sign(self, drafter: str, cumulative_wei: int) -> str:
        """The voucher for ``drafter``'s cumulative earnings, as JSON (called inside the ledger's
        crediting transaction)."""
        signed_wei = cumulative_wei // 2 if self.underpay else cumulative_wei
        voucher = Voucher(self.address, drafter, signed_wei, int(time.time()))
        signed = sign_voucher(self._key, self.escrow.domain, voucher)
        self.vouchers_signed += 1
        return signed.dumps()

    def pay(self, payees: Mapping[str, str]) -> Pay:
        """The ledger's ``Pay`` for one job (market.ledger)."""
        return Pay(self.tag, self.cfg.price_wei, dict(payees), self.sign)

    def refresh(self) -> EscrowState:
        """Read the escrow from the chain (blocking: in a worker thread on a trio loop), and warn
        when what it holds for vouchers is below the floor."""
        state = self._state = self.escrow.state(self.address)
        if self.low(state):
            log.warning(
                "the drafter escrow holds %s for vouchers, below the floor of %s: drafters may stop drafting",
                format_ether(state.available()),
                format_ether(self.cfg.floor_wei),
            )
        return state

    def low(self, state: EscrowState) -> bool:
        return state.available() < self.cfg.floor_wei

    def ensure_funded(self) -> EscrowState:
        """Top the escrow up to ``deposit_wei`` (from the operator's own account), and warn below the floor."""
        state = self.escrow.state(self.address)
        if state.balance < self.cfg.deposit_wei:
            missing = self.cfg.deposit_wei - state.balance
            tx = self.escrow.deposit(self._key, missing)
            log.info(
                "operator %s deposited %s in the drafter escrow (gas %d)",
                self.address,
                format_ether(missing),
                tx.gas_used,
            )
        return self.refresh()

    def describe(self) -> dict:
        """JSON-ready, for /health and the dashboard: the escrow as last read."""
        state = self._state
        if state is None:
            return {"escrow": self.escrow.address, "price_wei": self.cfg.price_wei, "low": None}
        return {
            "escrow": self.escrow.address,
            "price_wei": self.cfg.price_wei,
            "balance_wei": state.balance,
            "pending_withdrawal_wei": state.pending_withdrawal,
            "floor_wei": self.cfg.floor_wei,
            "low": self.low(state),
            "vouchers_signed": self.vouchers_signed,
        }
