"""What the engine counts and remembers of its last jobs, and the admission of jobs: at most
``max_jobs`` run at once.

A job over the cap is refused at once (``Overloaded``: HTTP 503 with Retry-After, an ``error``
frame on libp2p), never queued: a queue would only turn overload into deadline misses.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import trio

from verifier.decode import DecodeResult
from verifier.errors import SpecmarketError, Unavailable

RETRY_AFTER_S = 1  # what a refused client is told to wait (a job of the tiny pair takes well under that)
JOB_HISTORY = 50  # finished jobs the engine remembers (the dashboard's "last jobs")


class ClientGone(SpecmarketError):
    """The client disconnected (or stopped reading) before its answer was complete."""


class Overloaded(Unavailable):
    """The engine runs ``max_jobs`` jobs already: this one is refused now, not queued."""

    retry_after_s = RETRY_AFTER_S


@dataclass
class EngineCounters:
    requests: int = 0
    requests_failed: int = 0  # jobs that ended in an error (not the client's going away)
    requests_cancelled: int = 0  # jobs cancelled: the client went away or stalled, or the node stopped
    tokens_generated: int = 0
    target_passes: int = 0
    target_positions: int = 0
    draft_tokens_proposed: int = 0
    draft_tokens_accepted: int = 0
    active_jobs: int = 0
    requests_refused: int = 0  # refused because max_jobs were running (Overloaded)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start_job(self, max_jobs: int) -> None:
        """Count one more running job, or raise Overloaded when ``max_jobs`` already run."""
        with self._lock:
            if self.active_jobs >= max_jobs:
                self.requests_refused += 1
                raise Overloaded(f"the target is at capacity ({max_jobs} jobs running); retry in {RETRY_AFTER_S} s")
            self.requests += 1
            self.active_jobs += 1

    def count_end(self, error: BaseException) -> None:
        """A job that ended without a result: cancelled (the client went away, the node stopped) or failed."""
        with self._lock:
            if _abandoned(error):
                self.requests_cancelled += 1
            else:
                self.requests_failed += 1

    def add(self, result: DecodeResult) -> None:
        with self._lock:
            self.tokens_generated += len(result.tokens)
            self.target_passes += result.stats.target_passes
            self.target_positions += result.stats.target_positions
            self.draft_tokens_proposed += result.stats.draft_tokens_proposed
            self.draft_tokens_accepted += result.stats.draft_tokens_accepted

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {k: v for k, v in vars(self).items() if not k.startswith("_")}


def _abandoned(error: BaseException) -> bool:
    """Whether a job ended because it was cancelled (a group of cancellations included), not failed."""
    if isinstance(error, BaseExceptionGroup):
        return error.split((trio.Cancelled, ClientGone))[1] is None
    return isinstance(error, (trio.Cancelled, ClientGone))


def new_job_id() -> str:
    """A job's id: in its log lines, its response (``cmpl-<id>``), its stream's events."""
    return secrets.token_hex(8)


def format_stats(stats: dict[str, Any]) -> str:
    """A job's stats for its log line: ``key=value`` pairs, one line."""
    return " ".join(f"{key}={value}" for key, value in stats.items())


@dataclass(frozen=True)
class JobRecord:
    """One finished job, as the dashboard lists it (the numbers of its log line and response stats)."""

    job: str
    finished_at: float  # unix seconds
    tokens: int
    acceptance_rate: float  # accepted / proposed draft tokens (0 without drafts)
    mean_accepted_length: float  # tokens emitted per target pass
    tokens_per_second: float
    draft_wait_ms_per_round: float
    speculative: bool  # drafts were verified in this job (else plain decoding)
    replayed: bool  # a receipted answer served again, no decoding

    @classmethod
    def of(cls, job: str, tokens: int, stats: dict[str, Any]) -> JobRecord:
        return cls(
            job=job,
            finished_at=round(time.time(), 3),
            tokens=tokens,
            acceptance_rate=float(stats.get("acceptance_rate", 0.0)),
            mean_accepted_length=float(stats.get("mean_accepted_length", 0.0)),
            tokens_per_second=float(stats.get("tokens_per_second", 0.0)),
            draft_wait_ms_per_round=float(stats.get("draft_wait_ms_per_round", 0.0)),
            speculative=bool(stats.get("draft_tokens_proposed", 0)),
            replayed=bool(stats.get("replayed", 0)),
        )


class JobHistory:
    """The last ``JOB_HISTORY`` finished jobs, newest first, and each one's draft rounds (thread-safe)."""

    def __init__(self, size: int = JOB_HISTORY) -> None:
        self._jobs: deque[JobRecord] = deque(maxlen=size)
        self._rounds: dict[str, list[dict[str, Any]]] = {}  # job id -> its rounds (RoundRecord.to_json)
        self._lock = threading.Lock()

    def add(self, record: JobRecord, rounds: list[dict[str, Any]] | None = None) -> None:
        with self._lock:
            if len(self._jobs) == self._jobs.maxlen:
                self._rounds.pop(self._jobs[-1].job, None)  # the oldest job leaves with its rounds
            self._jobs.appendleft(record)
            self._rounds[record.job] = rounds or []

    def rounds(self, job: str) -> list[dict[str, Any]] | None:
        """The draft rounds of a remembered job ([] for a plain one); None: not remembered."""
        with self._lock:
            return self._rounds.get(job)

    def to_json(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(r) for r in self._jobs]
