"""The operator's side of drafter payments: its DrafterEscrow, its price, and the vouchers it signs.

A bonded target announces ``price_wei`` per accepted draft token in every ``open``, with the escrow,
its operator address, the ledger's lane and the job's largest pay. When a drafter names its payout
address, the target funds that drafter's lane (``cover``) so it holds what is owed plus one more job,
before the drafter's first draft; after each job
the market credits the job and signs one cumulative voucher per paid drafter in one ledger
transaction (market.ledger.Ledger.credit_and_pay, with ``Paymaster.pay``), and sends it in the
session's closing ``settle``. Payments come out of the escrow, never the bond.
"""

from __future__ import annotations

import logging
import threading
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
    DEFAULT_LANE_DEPOSIT_WEI,
    format_ether,
)
from node.chain.escrow import EscrowClient
from node.chain.vouchers import Voucher, sign_voucher
from p2p.messages import PayTerms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PaymentConfig:
    price_wei: int = DEFAULT_DRAFTER_PRICE_WEI
    deposit_wei: int = DEFAULT_ESCROW_DEPOSIT_WEI  # the pool is topped up to this at start (0: never)
    floor_wei: int = DEFAULT_ESCROW_FLOOR_WEI
    lane_wei: int = DEFAULT_LANE_DEPOSIT_WEI  # the least a lane is topped up by when it runs short

    def __post_init__(self) -> None:
        for name in ("price_wei", "deposit_wei", "floor_wei", "lane_wei"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ChainError(f"{name} must be a non-negative number of wei, got {value!r}")


class Paymaster:
    """Signs drafters' vouchers for one operator at one escrow, and keeps their lanes funded."""

    def __init__(
        self, escrow: EscrowClient, key: bytes, cfg: PaymentConfig, *, underpay: bool = False, unfunded: bool = False
    ) -> None:
        self.escrow, self.cfg = escrow, cfg
        self.underpay = underpay  # Cheat.UNDERPAY: every voucher for half the drafter's earnings (tests, demo)
        self.unfunded = unfunded  # Cheat.UNFUNDED: no lane is ever funded (tests)
        self._key = key  # never logged
        self.address = Account.from_key(key).address
        self.tag = f"{escrow.domain.chain_id}:{escrow.address}"  # the ledger's escrow key
        self.vouchers_signed = 0
        self.lanes_funded = 0
        self._pool: int | None = None  # as last read (refresh): /health never waits for the chain
        self._cover_lock = threading.Lock()  # one lane top-up at a time: two jobs never fund one lane twice

    @property
    def price_wei(self) -> int:
        return self.cfg.price_wei

    def terms(self, lane: int, max_tokens: int) -> PayTerms:
        """What a job's opens offer: the price, this escrow, operator and ``lane`` (the ledger's), and
        the most a job of ``max_tokens`` new tokens can pay one drafter."""
        domain = self.escrow.domain
        max_pay = self.cfg.price_wei * max_tokens
        return PayTerms(self.cfg.price_wei, domain.chain_id, domain.contract, self.address, lane, max_pay)

    def sign(self, drafter: str, lane: int, cumulative_wei: int) -> str:
        """The voucher for ``drafter``'s cumulative earnings on ``lane``, as JSON (called inside the
        ledger's crediting transaction)."""
        signed_wei = cumulative_wei // 2 if self.underpay else cumulative_wei
        voucher = Voucher(self.address, drafter, lane, signed_wei, int(time.time()))
        signed = sign_voucher(self._key, self.escrow.domain, voucher)
        self.vouchers_signed += 1
        return signed.dumps()

    def pay(self, payees: Mapping[str, str]) -> Pay:
        """The ledger's ``Pay`` for one job (market.ledger)."""
        return Pay(self.tag, self.cfg.price_wei, dict(payees), self.sign)

    def cover(self, drafter: str, lane: int, cumulative_wei: int, max_pay_wei: int) -> int:
        """Fund ``drafter``'s ``lane`` so that what it holds for vouchers (less a pending thaw) covers
        what its vouchers leave unredeemed (``cumulative_wei``, the ledger's newest, less what the lane
        paid) plus one more job's ``max_pay_wei``; the wei added (0 when it already does). Blocking
        chain calls: in a worker thread on a trio loop. From the pool first, the rest sent along."""
        if self.unfunded:
            return 0
        with self._cover_lock:
            state = self.escrow.lane(self.address, drafter, lane)
            need = max(0, cumulative_wei - state.paid) + max_pay_wei - state.available()
            if need <= 0:
                return 0
            amount = max(need, self.cfg.lane_wei)
            from_pool = min(self.escrow.pool(self.address), amount)
            tx = self.escrow.fund_lane(self._key, drafter, lane, from_pool, value=amount - from_pool)
            self.lanes_funded += 1
            log.info(
                "funded lane %d of drafter %s with %s (%s from the pool; gas %d)",
                lane, drafter, format_ether(amount), format_ether(from_pool), tx.gas_used,
            )  # fmt: skip
            return amount

    def refresh(self) -> int:
        """Read the pool from the chain (blocking: in a worker thread on a trio loop), and warn when
        it is below the floor."""
        pool = self._pool = self.escrow.pool(self.address)
        if self.low(pool):
            log.warning(
                "the drafter escrow pool holds %s, below the floor of %s: lanes will be funded from the "
                "operator's account",
                format_ether(pool),
                format_ether(self.cfg.floor_wei),
            )
        return pool

    def low(self, pool: int) -> bool:
        return pool < self.cfg.floor_wei

    def ensure_funded(self) -> int:
        """Top the pool up to ``deposit_wei`` (from the operator's own account), and warn below the floor."""
        pool = self.escrow.pool(self.address)
        if pool < self.cfg.deposit_wei:
            missing = self.cfg.deposit_wei - pool
            tx = self.escrow.deposit(self._key, missing)
            log.info(
                "operator %s deposited %s in the drafter escrow's pool (gas %d)",
                self.address,
                format_ether(missing),
                tx.gas_used,
            )
        return self.refresh()

    def describe(self) -> dict:
        """JSON-ready, for /health and the dashboard: the pool as last read."""
        pool = self._pool
        if pool is None:
            return {"escrow": self.escrow.address, "price_wei": self.cfg.price_wei, "low": None}
        return {
            "escrow": self.escrow.address,
            "price_wei": self.cfg.price_wei,
            "balance_wei": pool,
            "floor_wei": self.cfg.floor_wei,
            "low": self.low(pool),
            "vouchers_signed": self.vouchers_signed,
            "lanes_funded": self.lanes_funded,
        }
