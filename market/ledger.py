"""Accepted-token ledger: how many draft tokens each drafter got accepted, job by job.

One SQLite file in the node's data directory (stdlib ``sqlite3``, WAL mode), so the record
survives restarts. Each finished job is credited in one transaction: a row per (job, peer) for
audit, plus running per-peer totals for cheap reads. Crediting is idempotent: a job id already
credited is ignored (``credit`` returns False and logs a warning), so a retried credit after a
crash or a lost reply cannot double-count. Safe to share between threads: one connection,
guarded by a lock.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from market.registry import MAX_PEER_ID_LEN, MarketError, check_count, check_peer_id

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1  # stored in PRAGMA user_version

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
"""


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


class Ledger:
    """Per-drafter accepted-token totals in SQLite; a context manager."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
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
        rows = _check_credits(job_id, credits)
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                new = conn.execute("INSERT OR IGNORE INTO jobs VALUES (?, ?)", (job_id, time.time())).rowcount
                if not new:
                    conn.execute("ROLLBACK")
                    log.warning("ledger: job %s already credited; ignoring the repeat", job_id)
                    return False
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
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        log.debug("ledger: credited job %s to %d drafter(s)", job_id, len(rows))
        return True

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
