"""Accepted-token ledger: how many draft tokens each drafter got accepted, job by job.

One SQLite file in the node's data directory (stdlib ``sqlite3``, WAL mode), so the record
survives restarts. Each finished job is credited in one transaction: a row per (job, peer) for
audit, plus running per-peer totals for cheap reads. Crediting is idempotent: a job id already
credited is ignored (``credit`` returns False and logs a warning), so a retried credit after a
crash or a lost reply cannot double-count. Safe to share between threads: one connection,
guarded by a lock.

A paying operator credits with ``credit_and_pay``: in the same transaction, each paid drafter's
cumulative earnings at the operator's escrow grow by price x accepted and a new cumulative voucher
is signed for them and stored. So a crash either loses nothing or records both, and a job is never
paid twice (its id is credited once). Wei amounts are decimal strings: they outgrow SQLite's
64-bit integers.

Each ledger file has a *lane* of its own: a random 63-bit id drawn when the file is created and
kept in it. Its vouchers name that lane, and DrafterEscrow counts a voucher's cumulative total per
(chain, escrow, operator, drafter, lane). So two ledgers under one operator key (a target restarted
on a fresh data dir, a replica) never count over the same total: each pays from its own lane, and
neither underpays the other's work.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from market.registry import MAX_PEER_ID_LEN, MarketError, check_count, check_peer_id

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3  # stored in PRAGMA user_version; 2: earnings and vouchers; 3: the ledger's lane
LANE_BITS = 63  # a lane id is < 2**63 (the contract takes a uint64; 63 bits keep it a SQLite integer)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    credited_at REAL NOT NULL  -- unix time
);
CREATE TABLE IF NOT EXISTS credits (
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    peer_id TEXT NOT NULL,
    accepted INTEGER NOT NULL CHECK (accepted >= 0),
    proposed INTEGER NOT NULL CHECK (proposed >= accepted),
    PRIMARY KEY (job_id, peer_id)
);
CREATE TABLE IF NOT EXISTS totals (
    peer_id TEXT PRIMARY KEY,
    accepted INTEGER NOT NULL,
    proposed INTEGER NOT NULL,
    jobs INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS earnings (
    job_id TEXT NOT NULL REFERENCES jobs(job_id),
    peer_id TEXT NOT NULL,
    escrow TEXT NOT NULL,  -- "<chain id>:<address>": vouchers are cumulative per escrow
    drafter TEXT NOT NULL,  -- the payout address the drafter named in the job
    price_wei TEXT NOT NULL,
    wei TEXT NOT NULL,
    PRIMARY KEY (job_id, peer_id)
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS vouchers (
    escrow TEXT NOT NULL,
    drafter TEXT NOT NULL,
    cumulative_wei TEXT NOT NULL,
    voucher TEXT NOT NULL,  -- the newest signed voucher, as sent (on this ledger's lane)
    PRIMARY KEY (escrow, drafter)
);
"""

Signer = Callable[[str, int, int], str]  # (drafter address, lane, cumulative wei) -> the signed voucher as JSON


@dataclass(frozen=True)
class Pay:
    """How one job's credits are paid: the escrow, the price per accepted token, each drafter's
    payout address, and the operator's voucher signer."""

    escrow: str  # "<chain id>:<address>"
    price_wei: int
    payees: Mapping[str, str]  # peer id -> payout address (drafters that named none go unpaid)
    sign: Signer


@dataclass(frozen=True)
class LedgerEntry:
    peer_id: str
    accepted: int = 0
    proposed: int = 0
    jobs: int = 0


def _check_credits(job_id: object, credits: Mapping[str, tuple[int, int]]) -> list[tuple[str, int, int]]:
    if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_PEER_ID_LEN:
        raise MarketError(f"job id must be a non-empty str of at most {MAX_PEER_ID_LEN} chars, got {job_id!r:.80}")
    rows = []
    for peer_id, pair in credits.items():
        check_peer_id(peer_id)
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise MarketError(f"credit for {peer_id} must be (accepted, proposed), got {pair!r:.80}")
        accepted, proposed = check_count("accepted", pair[0]), check_count("proposed", pair[1])
        if accepted > proposed:
            raise MarketError(f"{peer_id}: accepted ({accepted}) exceeds proposed ({proposed})")
        rows.append((peer_id, accepted, proposed))
    return rows


def _pay(
    conn: sqlite3.Connection, job_id: str, rows: list[tuple[str, int, int]], pay: Pay, lane: int
) -> dict[str, str]:
    """Inside the crediting transaction: record each paid drafter's earnings and sign its new
    cumulative voucher (a signer that raises rolls the whole job back)."""
    vouchers = {}
    for peer, accepted, _ in rows:
        drafter = pay.payees.get(peer)
        if not accepted or not pay.price_wei or drafter is None:
            continue
        wei = accepted * pay.price_wei
        row = conn.execute(
            "SELECT cumulative_wei FROM vouchers WHERE escrow = ? AND drafter = ?", (pay.escrow, drafter)
        ).fetchone()
        cumulative = (int(row[0]) if row else 0) + wei
        vouchers[peer] = signed = pay.sign(drafter, lane, cumulative)
        conn.execute(
            "INSERT INTO earnings VALUES (?, ?, ?, ?, ?, ?)",
            (job_id, peer, pay.escrow, drafter, str(pay.price_wei), str(wei)),
        )
        conn.execute(
            "INSERT INTO vouchers VALUES (?, ?, ?, ?) ON CONFLICT (escrow, drafter) DO UPDATE SET "
            "cumulative_wei = excluded.cumulative_wei, voucher = excluded.voucher",
            (pay.escrow, drafter, str(cumulative), signed),
        )
    return vouchers


class Ledger:
    """Per-drafter accepted-token totals in SQLite; a context manager."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.lane = 0  # this file's lane id, read (or drawn) by _init_schema
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=10.0
        )
        try:
            self._init_schema(self._conn)
        except BaseException:
            self._conn.close()
            self._conn = None
            raise

    def _init_schema(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable across process crashes
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise MarketError(f"{self.path}: ledger schema v{version} is newer than this code (v{SCHEMA_VERSION})")
        conn.executescript(_SCHEMA)
        if version == 2:  # its vouchers were for a single-pool escrow (v1): a lane escrow starts afresh
            conn.execute("DELETE FROM vouchers")
        # a new file draws its lane; an existing one keeps it (INSERT OR IGNORE)
        conn.execute(
            "INSERT OR IGNORE INTO meta VALUES ('lane', ?)", (str(1 + secrets.randbelow((1 << LANE_BITS) - 1)),)
        )
        self.lane = int(conn.execute("SELECT value FROM meta WHERE key = 'lane'").fetchone()[0])
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise MarketError(f"ledger {self.path} is closed")
        return self._conn

    def credit(self, job_id: str, credits: Mapping[str, tuple[int, int]]) -> bool:
        """Credit one finished job: per peer, (accepted tokens, proposed tokens).

        All or nothing, in one transaction. Returns False (and changes nothing) when ``job_id``
        was already credited.
        """
        return self._credit(job_id, _check_credits(job_id, credits), None) is not None

    def credit_and_pay(self, job_id: str, credits: Mapping[str, tuple[int, int]], pay: Pay) -> dict[str, str] | None:
        """``credit``, and in the same transaction sign each paid drafter's new cumulative voucher:
        peer id -> voucher JSON for the drafters with accepted tokens and a payout address. None
        (nothing changed, nothing signed) when ``job_id`` was already credited."""
        if pay.price_wei < 0:
            raise MarketError(f"a price must be a non-negative number of wei, got {pay.price_wei}")
        return self._credit(job_id, _check_credits(job_id, credits), pay)

    def _credit(self, job_id: str, rows: list[tuple[str, int, int]], pay: Pay | None) -> dict[str, str] | None:
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                new = conn.execute("INSERT OR IGNORE INTO jobs VALUES (?, ?)", (job_id, time.time())).rowcount
                if not new:
                    conn.execute("ROLLBACK")
                    log.warning("ledger: job %s already credited; ignoring the repeat", job_id)
                    return None
                conn.executemany(
                    "INSERT INTO credits (job_id, peer_id, accepted, proposed) VALUES (?, ?, ?, ?)",
                    [(job_id, *row) for row in rows],
                )
                conn.executemany(
                    "INSERT INTO totals (peer_id, accepted, proposed, jobs) VALUES (?, ?, ?, 1) "
                    "ON CONFLICT (peer_id) DO UPDATE SET accepted = accepted + excluded.accepted, "
                    "proposed = proposed + excluded.proposed, jobs = jobs + 1",
                    rows,
                )
                vouchers = _pay(conn, job_id, rows, pay, self.lane) if pay is not None else {}
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        log.debug("ledger: credited job %s to %d drafter(s), %d voucher(s)", job_id, len(rows), len(vouchers))
        return vouchers

    def voucher(self, escrow: str, drafter: str) -> tuple[int, str] | None:
        """The newest voucher signed for ``drafter`` at ``escrow`` on this ledger's lane: (cumulative wei,
        its JSON)."""
        rows = self._query(
            "SELECT cumulative_wei, voucher FROM vouchers WHERE escrow = ? AND drafter = ?", (escrow, drafter)
        )
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def earnings(self) -> dict[str, int]:
        """Wei each drafter (by peer id) has earned in all, summed over escrows."""
        out: dict[str, int] = {}
        for peer, wei in self._query("SELECT peer_id, wei FROM earnings"):
            out[peer] = out.get(peer, 0) + int(wei)
        return out

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._connection().execute(sql, args).fetchall()

    def totals(self) -> dict[str, LedgerEntry]:
        """Every credited peer's totals, keyed by peer id (sorted)."""
        rows = self._query("SELECT peer_id, accepted, proposed, jobs FROM totals ORDER BY peer_id")
        return {row[0]: LedgerEntry(*row) for row in rows}

    def get(self, peer_id: str) -> LedgerEntry:
        """One peer's totals; zeros for a peer never credited."""
        check_peer_id(peer_id)
        rows = self._query("SELECT peer_id, accepted, proposed, jobs FROM totals WHERE peer_id = ?", (peer_id,))
        return LedgerEntry(*rows[0]) if rows else LedgerEntry(peer_id)

    def has_job(self, job_id: str) -> bool:
        """Whether ``job_id`` has been credited."""
        return bool(self._query("SELECT 1 FROM jobs WHERE job_id = ?", (job_id,)))

    def close(self) -> None:
        """Close the database (idempotent); later calls raise ``MarketError``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
