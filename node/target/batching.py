"""Batched verification: the target's passes of every job that waits for one run as one pass.

Each job decodes in its own worker thread (node.target.engine). Its target cache is a ``BatchedLM``:
``extend`` hands the job's rows to the engine's ``PassBatcher`` and waits. A batcher thread (one
per core the process may use) takes every request queued when it is free, up to ``max_rows`` rows
in all (first come, first served; a request wider than the cap runs alone), scores them in one
pass (node.model.kernels.batch.extend_batch: bit for bit each job's own logits on the
shape-invariant served kernel) and wakes each job with its rows. Nothing waits to fill a pass: a job whose drafts
are late is simply not queued yet, and joins the next pass; a plain job shares passes like any
other. A job never waits for more than the pass in flight plus the passes ahead of it in the queue
(one, while the queued rows fit the cap).

One request never fails the others: each is checked before it joins a pass (a request that cannot
run fails alone), and if a shared pass raises anyway every request in it is run again alone, each
getting its own result or its own error.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from node.model.kernels.batch import BatchError, check_batch, extend_batch
from node.target.config import DEFAULT_BATCH_ROWS

log = logging.getLogger(__name__)


@dataclass
class _Request:
    model: object  # a LeanLM fork
    tokens: list[int]
    done: threading.Event = field(default_factory=threading.Event)
    logits: np.ndarray | None = None
    error: BaseException | None = None


class PassBatcher:
    """Runs the target's passes for every job, sharing each pass among the jobs that wait for one."""

    def __init__(self, max_rows: int = DEFAULT_BATCH_ROWS, workers: int | None = None) -> None:
        if max_rows < 1:
            raise ValueError(f"a pass needs room for at least one row, got {max_rows}")
        self.max_rows = max_rows
        self._queue: deque[_Request] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self.passes = 0  # shared passes run
        self.rows = 0  # rows they scored
        self.jobs_per_pass: list[int] = []  # the newest passes' job counts (bounded)
        # one pass at a time per core this process may use: jobs that ran their passes side by side on
        # several cores before batching still do (each of those passes shared among the jobs queued)
        count = workers or len(os.sched_getaffinity(0))
        for i in range(count):
            threading.Thread(target=self._run, name=f"pass-batcher-{i}", daemon=True).start()

    def extend(self, model, tokens: Sequence[int]) -> np.ndarray:  # -> [len(tokens), V]
        """``model.extend(tokens)``, in the next shared pass (blocks the calling job's thread)."""
        request = _Request(model, list(tokens))
        check_batch([model], [request.tokens])  # a request that cannot run fails alone, before it joins a pass
        with self._ready:
            if self._closed:
                raise BatchError("the engine is closed")
            self._queue.append(request)
            self._ready.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.logits is not None
        return request.logits

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _take(self) -> list[_Request] | None:
        """The requests of the next pass (FIFO, up to max_rows rows; at least one); None once closed."""
        with self._ready:
            while not self._queue and not self._closed:
                self._ready.wait()
            if not self._queue:
                return None
            batch = [self._queue.popleft()]
            rows = len(batch[0].tokens)
            while self._queue and rows + len(self._queue[0].tokens) <= self.max_rows:
                rows += len(self._queue[0].tokens)
                batch.append(self._queue.popleft())
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            self._pass(batch)

    def _pass(self, batch: list[_Request]) -> None:
        try:
            results = extend_batch([r.model for r in batch], [r.tokens for r in batch])
        except Exception as exc:  # any failure: the request fails alone, or each runs again alone (below)
            if len(batch) == 1:
                batch[0].error = exc
            else:
                log.warning("a shared pass of %d jobs failed (%s); running each alone", len(batch), exc)
                for request in batch:
                    self._pass([request])
                return
        else:
            for request, logits in zip(batch, results, strict=True):
                request.logits = logits
            with self._ready:  # counted under the lock: several workers finish passes
                self.passes += 1
                self.rows += sum(len(r.tokens) for r in batch)
                self.jobs_per_pass = [*self.jobs_per_pass[-255:], len(batch)]
        for request in batch:
            request.done.set()


class BatchedLM:
    """A job's target cache whose passes go through the engine's ``PassBatcher`` (a
    ``verifier.LanguageModel``: extend, rollback, cached; ``inner`` is the LeanLM fork)."""

    def __init__(self, inner, batcher: PassBatcher) -> None:
        self.inner, self.batcher = inner, batcher
        self.vocab_size, self.max_positions, self.name = inner.vocab_size, inner.max_positions, inner.name

    def cached(self) -> Sequence[int]:
        return self.inner.cached()

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        return self.batcher.extend(self.inner, tokens)

    def rollback(self, n: int) -> None:
        self.inner.rollback(n)
