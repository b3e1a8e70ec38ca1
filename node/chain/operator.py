"""The bonded target operator: its key, its bond, and a signed receipt for every answer.

Receipts are kept in SQLite (``receipts.sqlite`` in the node's data dir) keyed by request hash, so
they survive a restart, and so the operator never signs two different outputs for one request:
an identical request is answered from the store (two receipts for one request with different
outputs would be equivocation, slashable at once, even when the difference were float noise).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account

from node.chain import ChainError
from node.chain.cheat import Cheat
from node.chain.client import BondClient, transfer
from node.chain.deployment import DEV_DEPLOYER, ETHER, dev_key, require_dev_chain
from node.chain.keys import load_or_create_key
from node.chain.receipts import Receipt, RequestSpec, SignedReceipt, hash_tokens, sign_receipt

log = logging.getLogger(__name__)

RECEIPTS_FILE = "receipts.sqlite"
GAS_RESERVE_WEI = ETHER  # what a dev-chain operator is funded with on top of its bond, for gas


class ReceiptStore:
    """request hash -> signed receipt, in SQLite (WAL); safe across threads and restarts."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS receipts ("
            " request_hash BLOB PRIMARY KEY, receipt TEXT NOT NULL, created REAL NOT NULL)"
        )
        self._lock = threading.Lock()

    def get(self, request_hash: bytes) -> SignedReceipt | None:
        with self._lock:
            row = self._db.execute("SELECT receipt FROM receipts WHERE request_hash = ?", (request_hash,)).fetchone()
        return SignedReceipt.from_json(json.loads(row[0])) if row else None

    def put_first(self, signed: SignedReceipt) -> SignedReceipt:
        """Store ``signed`` unless its request already has a receipt; the stored one either way."""
        key = signed.receipt.request_hash
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO receipts (request_hash, receipt, created) VALUES (?, ?, ?)",
                (key, json.dumps(signed.to_json()), time.time()),
            )
        stored = self.get(key)
        assert stored is not None
        return stored

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM receipts").fetchone()[0]

    def close(self) -> None:
        self._db.close()


@dataclass(frozen=True)
class BondStatus:
    address: str
    registered_now: bool  # this start registered it
    topped_up: int  # wei added to reach the wanted bond at this start
    bond: int


class Operator:
    """Signs a receipt for every answer, in the domain of one SpecmarketBond deployment."""

    def __init__(self, client: BondClient, key: bytes, model_hash: bytes, store: ReceiptStore) -> None:
        self.client = client
        self._key = key  # never logged
        self.address = Account.from_key(key).address
        self.model_hash = model_hash
        self.store = store
        self._sign_lock = threading.Lock()

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
        return self.store.get(request.hash())

    def sign(self, request: RequestSpec, output: Sequence[int]) -> SignedReceipt:
        """Sign (and persist) the receipt for ``output``; if this request was already answered, the
        stored receipt is returned instead and nothing new is signed."""
        with self._sign_lock:
            stored = self.lookup(request)
            if stored is not None:
                return stored
            receipt = Receipt(
                operator=self.address,
                model_hash=self.model_hash,
                request_hash=request.hash(),
                output_hash=hash_tokens(output),
                token_count=len(output),
                issued_at=int(time.time()),
            )
            signature = sign_receipt(self._key, self.client.domain, receipt)
            signed = SignedReceipt(self.client.domain, receipt, signature, request, tuple(int(t) for t in output))
            return self.store.put_first(signed)


@dataclass(frozen=True)
class OperatorConfig:
    """How a target node bonds: the chain, the deployment, the key, the bond, honesty."""

    rpc: str
    deployments_dir: Path
    key_file: Path  # the operator's private key (hex), created 0600 if missing
    bond_wei: int | None = None  # None: the contract's minimum
    cheat: Cheat = Cheat.NONE


def open_operator(cfg: OperatorConfig, model_dir: Path, data_dir: Path) -> tuple[Operator, BondStatus]:
    """Connect to the deployment, load the key, and register/bond if needed (blocking)."""
    from node.chain.client import connect
    from node.chain.deployment import Deployment
    from node.models import model_hash

    w3 = connect(cfg.rpc)
    deployment = Deployment.load(cfg.deployments_dir, int(w3.eth.chain_id))
    client = BondClient(w3, deployment.address)
    store = ReceiptStore(data_dir / RECEIPTS_FILE)
    operator = Operator(client, load_or_create_key(cfg.key_file), model_hash(model_dir), store)
    status = operator.ensure_bonded(cfg.bond_wei)
    log.info(
        "operator %s bonded %d wei on chain %d (contract %s); %d receipts on file%s",
        status.address,
        status.bond,
        client.domain.chain_id,
        client.address,
        store.count(),
        f"; CHEATING: {cfg.cheat.value}" if cfg.cheat is not Cheat.NONE else "",
    )
    return operator, status
