"""The operator's receipt store: every receipt it signed, keyed by request hash, in SQLite.

The store is what keeps an honest operator from equivocating: an identical request is answered
from it, never signed twice (two receipts for one request with different outputs are slashable at
once, even when the difference were float noise between runs). So a node refuses to serve with a
store that cannot do that job, unless told to start a new one (``--new-receipt-store``):

- the store is missing while the key is already registered on chain (a lost or wrong data dir);
- the store predates this format (no owner record: it cannot say whose receipts it holds);
- the store belongs to another operator or another deployment;
- another process holds it (two nodes sharing one store, or one key).

Receipts are keyed by (model hash, request hash): a stored answer is served only under the model
that made it. An operator that changes its model (unbond, withdraw, register the new one) keeps its
key and store, and a request it answered under the old model is answered anew under the new one;
the contract counts two receipts as equivocation only under one model hash, so that is none. (A
store keyed by request alone would re-sign the old model's answer under the new hash: a wrong-token
challenge the honest operator would lose.)

Each store has a random 64-bit ``nonce``, made when it is created and kept in it. Every receipt
names it (``Receipt.storeNonce``), and the contract counts two receipts as equivocation only when
one store signed both: a node that lost its store, or a second replica with the same key on another
machine, signs under another nonce, so float noise between them is no slashable equivocation (a
wrong answer under any nonce is still a wrong-token challenge). A replaced store is renamed aside,
never deleted.
"""

from __future__ import annotations

import fcntl
import json
import logging
import secrets
import sqlite3
import threading
import time
from pathlib import Path

from eth_utils import to_checksum_address

from node.chain import ChainError
from node.chain.receipts import Domain, SignedReceipt

log = logging.getLogger(__name__)

STORE_FORMAT = 3  # 1: receipts only, no owner record; 2: receipts keyed by request hash alone
OWNER_FORMAT = 2  # the first format that names its owner (older stores are refused)
RECEIPTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS {name} (model_hash BLOB NOT NULL, request_hash BLOB NOT NULL,"
    " receipt TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (model_hash, request_hash))"
)
NONCE_BITS = 64


class StoreError(ChainError):
    """A receipt store that cannot be used safely (missing, unmigrated, someone else's, in use)."""


class ReceiptStore:
    """request hash -> signed receipt, in SQLite (WAL); safe across threads and restarts; held
    exclusively (an advisory lock beside the file) while open."""

    def __init__(self, path: Path, held=None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock_file = held or _lock(path)  # ``held``: the lock, already taken by open_store
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        _migrate_to_model_keys(self._db)
        self._db.execute(RECEIPTS_TABLE.format(name="receipts"))
        self._db.execute(
            "INSERT OR IGNORE INTO meta VALUES ('format', ?), ('nonce', ?)",
            (str(STORE_FORMAT), str(secrets.randbits(NONCE_BITS))),
        )
        self._lock = threading.Lock()

    def meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    @property
    def nonce(self) -> int:
        return int(self.meta("nonce") or 0)

    def bind(self, operator: str, domain: Domain) -> None:
        """Record whose receipts this store holds (the first owner stays)."""
        owner = json.dumps(_owner(operator, domain))
        with self._lock:
            self._db.execute("INSERT OR IGNORE INTO meta VALUES ('owner', ?)", (owner,))

    def get(self, model_hash: bytes, request_hash: bytes) -> SignedReceipt | None:
        """The receipt signed for ``request_hash`` under ``model_hash`` (None: not answered under that model)."""
        with self._lock:
            row = self._db.execute(
                "SELECT receipt FROM receipts WHERE model_hash = ? AND request_hash = ?", (model_hash, request_hash)
            ).fetchone()
        return SignedReceipt.from_json(json.loads(row[0])) if row else None

    def put_first(self, signed: SignedReceipt) -> SignedReceipt:
        """Store ``signed`` unless its request already has a receipt under its model; the stored one either way."""
        key = (signed.receipt.model_hash, signed.receipt.request_hash)
        with self._lock:
            self._db.execute(
                "INSERT OR IGNORE INTO receipts (model_hash, request_hash, receipt, created) VALUES (?, ?, ?, ?)",
                (*key, json.dumps(signed.to_json()), time.time()),
            )
        stored = self.get(*key)
        assert stored is not None
        return stored

    def refresh(self, signed: SignedReceipt) -> None:
        """Replace the stored receipt of ``signed``'s request and model by ``signed``, which must name
        the same output (a later ``issuedAt`` for the same answer is no equivocation)."""
        key = (signed.receipt.model_hash, signed.receipt.request_hash)
        stored = self.get(*key)
        if stored is None or stored.output != signed.output:
            raise StoreError("a refreshed receipt must name the stored output under the same model")
        with self._lock:
            self._db.execute(
                "UPDATE receipts SET receipt = ? WHERE model_hash = ? AND request_hash = ?",
                (json.dumps(signed.to_json()), *key),
            )

    def count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM receipts").fetchone()[0]

    def close(self) -> None:
        self._db.close()
        self._lock_file.close()  # releases the lock


def _migrate_to_model_keys(db: sqlite3.Connection) -> None:
    """A format-2 store (receipts keyed by request hash alone) rekeyed by (model hash, request
    hash), each receipt under the model it names; one transaction, so a crash leaves either."""
    columns = [row[1] for row in db.execute("PRAGMA table_info(receipts)")]
    if not columns or "model_hash" in columns:
        return
    rows = db.execute("SELECT request_hash, receipt, created FROM receipts").fetchall()
    keyed = [(SignedReceipt.from_json(json.loads(r)).receipt.model_hash, h, r, c) for h, r, c in rows]
    with db:  # one transaction (the connection is in autocommit mode otherwise)
        db.execute("BEGIN")
        db.execute(RECEIPTS_TABLE.format(name="receipts_by_model"))
        db.executemany("INSERT INTO receipts_by_model VALUES (?, ?, ?, ?)", keyed)
        db.execute("DROP TABLE receipts")
        db.execute("ALTER TABLE receipts_by_model RENAME TO receipts")
        db.execute("INSERT OR REPLACE INTO meta VALUES ('format', ?)", (str(STORE_FORMAT),))
    log.info("receipt store: %d receipts rekeyed by model and request (format %d)", len(keyed), STORE_FORMAT)


def _owner(operator: str, domain: Domain) -> dict:
    return {"operator": to_checksum_address(operator), "chain_id": domain.chain_id, "contract": domain.contract}


def _lock(path: Path):
    handle = open(path.with_name(path.name + ".lock"), "a")  # noqa: SIM115 - held until close()
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise StoreError(
            f"another process is serving with the receipt store {path}: two nodes with one store could "
            "sign two receipts for one request"
        ) from None
    return handle


def store_problem(path: Path, operator: str, domain: Domain, *, registered: bool) -> str:
    """Why the store at ``path`` cannot serve ``operator`` in ``domain`` ("" when it can)."""
    if not path.exists():
        if registered:
            return (
                f"operator {operator} is registered on chain but its receipt store {path} is missing: answering "
                "requests it answered before could sign a second, different receipt (slashable)"
            )
        return ""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = dict(db.execute("SELECT key, value FROM meta").fetchall())
    except sqlite3.Error:
        rows = {}
    if int(rows.get("format", 1)) < OWNER_FORMAT or "owner" not in rows:
        return f"the receipt store {path} predates store format {OWNER_FORMAT} (it does not name its operator)"
    owner = json.loads(rows["owner"])
    if owner != _owner(operator, domain):
        return f"the receipt store {path} holds receipts of {owner}, not of operator {operator} on this deployment"
    return ""


def open_store(path: Path, operator: str, domain: Domain, *, registered: bool, new: bool = False) -> ReceiptStore:
    """The operator's store, checked (see the module docstring); ``new`` starts a new one, moving
    any old one aside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    held = _lock(path)  # first: nothing is checked or moved under another process's feet
    problem = store_problem(path, operator, domain, registered=registered)
    if problem and not new:
        held.close()
        raise StoreError(f"{problem}; restore the store, or start a new one with --new-receipt-store")
    if new and path.exists():
        aside = path.with_name(f"{path.name}.replaced-{int(time.time())}")
        path.rename(aside)
        for suffix in ("-wal", "-shm"):
            if (extra := path.with_name(path.name + suffix)).exists():
                extra.rename(aside.with_name(aside.name + suffix))
        log.warning("moved the old receipt store aside to %s; starting a new one", aside)
    store = ReceiptStore(path, held)
    store.bind(operator, domain)
    return store
