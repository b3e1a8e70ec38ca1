"""The bonded target operator: its key, its bond, and a signed receipt for every answer.

Receipts are kept in the receipt store (``receipts.sqlite`` in the node's data dir, see
node/chain/store.py) keyed by request hash, so they survive a restart, and so the operator never
signs two different outputs for one request: an identical request is answered from the store.

The operator signs only while the chain says it may (node/chain/standing.py: registered, active,
not slashed, the chain answering), and stamps receipts with the chain's clock. A stored answer
replayed after ``RECEIPT_FRESH_S`` is re-signed with a fresh ``issuedAt`` (same output, so no
equivocation), so a client never gets a receipt whose challenge window has run out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eth_account import Account

from node.chain import ChainError
from node.chain.cheat import Cheat
from node.chain.client import BondClient, transfer
from node.chain.deployment import DEV_DEPLOYER, ETHER, dev_key, format_ether, require_dev_chain
from node.chain.escrow import EscrowClient
from node.chain.keys import load_or_create_key
from node.chain.paymaster import Paymaster, PaymentConfig
from node.chain.receipts import RECEIPT_FRESH_S, Receipt, RequestSpec, SignedReceipt, hash_tokens, sign_receipt
from node.chain.standing import Standing, StandingWatch
from node.chain.store import ReceiptStore, open_store

log = logging.getLogger(__name__)

RECEIPTS_FILE = "receipts.sqlite"
GAS_RESERVE_WEI = ETHER  # what a dev-chain operator is funded with on top of its bond, for gas


@dataclass(frozen=True)
class BondStatus:
    address: str
    registered_now: bool  # this start registered it
    topped_up: int  # wei added to reach the wanted bond at this start
    bond: int


class Operator:
    """Signs a receipt for every answer, in the domain of one SpecmarketBond deployment."""

    def __init__(
        self, client: BondClient, key: bytes, model_hash: bytes, store: ReceiptStore, watch: StandingWatch | None = None
    ) -> None:
        self.client = client
        self._key = key  # never logged
        self.address = Account.from_key(key).address
        self.model_hash = model_hash
        self.store = store
        self.watch = watch  # None: sign unconditionally, on the local clock (tests of the store alone)
        self._sign_lock = threading.Lock()
        self.paymaster: Paymaster | None = None  # pays drafters from the DrafterEscrow (open_payments)
        self.receipts_signed = 0  # signatures made since this start (new answers and fresh re-signs)

    def standing(self) -> Standing | None:
        return self.watch.current() if self.watch is not None else None

    def require_serving(self) -> None:
        """Raise ``NotServing`` unless the chain says this operator may sign now."""
        if self.watch is not None:
            self.watch.require_serving()

    def _now(self) -> int:
        return self.watch.chain_time() if self.watch is not None else int(time.time())

    def describe(self) -> dict:
        """JSON-ready, for /health: who signs, where, and whether it may sign now (and why not)."""
        standing = self.standing()
        return {
            "address": self.address,
            "contract": self.client.address,
            "chain_id": self.client.domain.chain_id,
            "receipt_store": f"{self.store.nonce:016x}",
            "receipts_signed": self.receipts_signed,
            "payments": None if self.paymaster is None else self.paymaster.describe(),
            **(standing.to_json() if standing is not None else {"serving": True}),
        }

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.store.close()

    def ensure_bonded(self, bond: int | None = None) -> BondStatus:
        """Register with ``bond`` (default: the contract's minimum) if needed, or top up to it."""
        minimum = self.client.call("minBond")
        wanted = max(bond or minimum, minimum)
        info = self.client.operator_info(self.address)
        if info.registered and info.model_hash != self.model_hash:
            raise ChainError(
                f"operator {self.address} is bonded for model 0x{info.model_hash.hex()}, not "
                f"0x{self.model_hash.hex()}: use the committed model or another operator key"
            )
        if info.registered and info.unbond_at:
            raise ChainError(f"operator {self.address} is unbonding (since {info.unbond_at}); it cannot serve")
        missing = wanted if not info.registered else max(0, wanted - info.bond)
        if missing:
            self._fund(missing + GAS_RESERVE_WEI // 10)
        if not info.registered:
            tx = self.client.register(self._key, self.model_hash, wanted)
            log.info("operator %s registered with a bond of %d wei (gas %d)", self.address, wanted, tx.gas_used)
        elif missing:
            tx = self.client.send(self._key, "topUp", value=missing)
            log.info("operator %s topped its bond up by %d wei (gas %d)", self.address, missing, tx.gas_used)
        bond_now = self.client.operator_info(self.address).bond
        return BondStatus(self.address, not info.registered, missing if info.registered else 0, bond_now)

    def open_payments(self, escrow: str, cfg: PaymentConfig, *, cheat: Cheat = Cheat.NONE) -> Paymaster:
        """Pay drafters from the DrafterEscrow at ``escrow``: top it up to ``cfg.deposit_wei`` (on a dev
        chain, funding the operator's account first) and sign vouchers at ``cfg.price_wei``."""
        escrow_client = EscrowClient(self.client.w3, escrow)
        unfunded = cheat is Cheat.UNFUNDED
        paymaster = Paymaster(escrow_client, self._key, cfg, underpay=cheat is Cheat.UNDERPAY, unfunded=unfunded)
        missing = cfg.deposit_wei - paymaster.escrow.pool(self.address)
        if missing > 0:
            self._fund(missing + GAS_RESERVE_WEI // 10)
        pool = paymaster.ensure_funded()
        log.info(
            "operator %s pays drafters %d wei per accepted token from escrow %s (%s in its pool)",
            self.address,
            cfg.price_wei,
            paymaster.escrow.address,
            format_ether(pool),
        )
        self.paymaster = paymaster
        return paymaster

    def _fund(self, needed: int) -> None:
        """On a dev chain, fund the operator from anvil's account 0; elsewhere say what is missing."""
        w3 = self.client.w3
        balance = w3.eth.get_balance(self.address)
        if balance >= needed:
            return
        chain_id = self.client.domain.chain_id
        try:
            require_dev_chain(chain_id, "funding the operator")
        except ChainError:
            raise ChainError(
                f"operator {self.address} has {balance} wei; it needs {needed} wei on chain {chain_id}"
            ) from None
        transfer(w3, dev_key(DEV_DEPLOYER), self.address, needed - balance + GAS_RESERVE_WEI)

    def lookup(self, request: RequestSpec) -> SignedReceipt | None:
        """The stored receipt of an answered request, re-signed with a fresh ``issuedAt`` when it is
        older than RECEIPT_FRESH_S (the same output: a replay never changes the answer)."""
        with self._sign_lock:
            stored = self.store.get(self.model_hash, request.hash())  # never another model's answer
            if stored is None or self._now() - stored.receipt.issued_at <= RECEIPT_FRESH_S:
                return stored
            self.require_serving()
            fresh = self._signed(request, stored.output)
            self.store.refresh(fresh)
            log.info(
                "re-signed a stored answer with a fresh issuedAt (it was %d s old)",
                fresh.receipt.issued_at - stored.receipt.issued_at,
            )
            return fresh

    def _signed(self, request: RequestSpec, output: Sequence[int]) -> SignedReceipt:
        receipt = Receipt(
            operator=self.address,
            model_hash=self.model_hash,
            request_hash=request.hash(),
            output_hash=hash_tokens(output),
            token_count=len(output),
            issued_at=self._now(),
            store_nonce=self.store.nonce,
        )
        signature = sign_receipt(self._key, self.client.domain, receipt)
        self.receipts_signed += 1  # under _sign_lock
        return SignedReceipt(self.client.domain, receipt, signature, request, tuple(int(t) for t in output))

    def sign(self, request: RequestSpec, output: Sequence[int]) -> SignedReceipt:
        """Sign (and persist) the receipt for ``output``; if this request was already answered, the
        stored receipt is returned instead and nothing new is signed. Raises ``NotServing`` when
        the chain says this operator may not sign."""
        self.require_serving()
        stored = self.lookup(request)
        if stored is not None:
            return stored
        with self._sign_lock:
            return self.store.put_first(self._signed(request, output))


@dataclass(frozen=True)
class OperatorConfig:
    """How a target node bonds: the chain, the deployment, the key, the bond, honesty."""

    rpc: str
    deployments_dir: Path
    key_file: Path  # the operator's private key (hex), created 0600 if missing
    bond_wei: int | None = None  # None: the contract's minimum
    cheat: Cheat = Cheat.NONE
    new_store: bool = False  # start a new receipt store even where the old one is missing or unusable
    payments: PaymentConfig | None = field(default_factory=PaymentConfig)  # None: drafters go unpaid


def open_operator(cfg: OperatorConfig, model_dir: Path, data_dir: Path) -> tuple[Operator, BondStatus]:
    """Connect to the deployment, load the key, and register/bond if needed (blocking)."""
    from node.chain.client import connect
    from node.chain.deployment import Deployment
    from node.model.loading import model_hash

    w3 = connect(cfg.rpc)
    deployment = Deployment.load(cfg.deployments_dir, int(w3.eth.chain_id))
    client = BondClient(w3, deployment.address)
    key, committed = load_or_create_key(cfg.key_file), model_hash(model_dir)
    address = Account.from_key(key).address
    registered = client.operator_info(address).registered
    store = open_store(data_dir / RECEIPTS_FILE, address, client.domain, registered=registered, new=cfg.new_store)
    try:
        operator = Operator(client, key, committed, store)
        status = operator.ensure_bonded(cfg.bond_wei)
        operator.watch = StandingWatch(client, address, committed)
        if cfg.payments is not None and deployment.escrow:
            operator.open_payments(deployment.escrow, cfg.payments, cheat=cfg.cheat)
        elif cfg.payments is not None:
            log.warning("deployment %s records no DrafterEscrow: drafters go unpaid (redeploy it)", deployment.address)
    except BaseException:
        store.close()  # releases the store's lock
        raise
    operator.watch.start()
    log.info(
        "operator %s bonded %d wei on chain %d (contract %s); %d receipts in store %016x%s",
        status.address,
        status.bond,
        client.domain.chain_id,
        client.address,
        store.count(),
        store.nonce,
        f"; CHEATING: {cfg.cheat.value}" if cfg.cheat is not Cheat.NONE else "",
    )
    return operator, status
