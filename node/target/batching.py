"""Batched verification: the target's passes of every job that waits for one run as one pass.

Each job decodes in its own worker thread (node.target.engine). Its target cache is a ``BatchedLM``:
``extend`` hands the job's rows to the engine's ``PassBatcher`` and waits. A batcher thread (one
per core the process may use) takes the requests queued when it is free, scores them in one pass
(node.model.kernels.batch.extend_batch: bit for bit each job's own logits on the shape-invariant
served kernel) and wakes each job with its rows. Which requests a pass takes:
- every request that a pass has already left behind: a job never waits more than one pass for a
  slot (so a pass may grow past the cap, by at most the rows of the jobs it left behind);
- then the rest in arrival order while their rows fit ``max_rows`` (a pass takes one request at
  least, so one wider than the cap, a long prefill, runs alone).
A pass waits for no job's drafts: a job whose drafts are late is simply not queued yet, and joins
the next pass; a plain job shares passes like any other. The one wait: with a request queued, a
free batcher gives the jobs of its last pass up to REJOIN_S to queue their next one (sampling a
token takes a plain job a few ms). Without it two jobs take turns, each pass holding one of them,
as the engine's test of a plain and a speculative job found.

One request never fails the others: each is checked before it joins a pass (a request that cannot
run fails alone), and if a shared pass raises anyway every request in it is run again alone, each
getting its own result or its own error.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from node.model.kernels.batch import BatchError, check_batch, extend_batch
from node.target.config import DEFAULT_BATCH_ROWS

log = logging.getLogger(__name__)

REJOIN_S = 0.01  # how long a free batcher waits for the jobs of its last pass to queue again (above)


@dataclass
class PassRequest:
    model: object  # a LeanLM fork
    tokens: list[int]
    parents: list[int] | None  # a tree's rows (LeanLM.extend_tree); None: a chain
    passed_over: bool = False  # a pass began while it waited and left it behind: the next one takes it
    done: threading.Event = field(default_factory=threading.Event)
    logits: np.ndarray | None = None
    error: BaseException | None = None


class PassBatcher:
    """Runs the target's passes for every job, sharing each pass among the jobs that wait for one."""

    def __init__(self, max_rows: int = DEFAULT_BATCH_ROWS, workers: int | None = None, start: bool = True) -> None:
        if max_rows < 1:
            raise ValueError(f"a pass needs room for at least one row, got {max_rows}")
        self.max_rows = max_rows
        self._queue: deque[PassRequest] = deque()
        self._ready = threading.Condition()
        self._closed = False
        self.passes = 0  # passes run
        self.shared = 0  # ... of them with more than one job
        self.rows = 0  # rows they scored
        self.jobs_per_pass: list[int] = []  # the newest passes' job counts (bounded)
        # one pass at a time per core this process may use: jobs that ran their passes side by side on
        # several cores before batching still do (each of those passes shared among the jobs queued)
        count = workers or len(os.sched_getaffinity(0))
        for i in range(count if start else 0):  # (not started: a test drives _take itself)
            threading.Thread(target=self._run, name=f"pass-batcher-{i}", daemon=True).start()

    def extend(self, model, tokens: Sequence[int], parents: Sequence[int] | None = None) -> np.ndarray:
        """``model.extend(tokens)`` (``extend_tree`` with ``parents``), in the next shared pass (blocks
        the calling job's thread); [len(tokens), V]."""
        request = PassRequest(model, list(tokens), None if parents is None else list(parents))
        # a request that cannot run fails alone, before it joins a pass
        check_batch([model], [request.tokens], [request.parents])
        self._enqueue(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.logits is not None
        return request.logits

    def _enqueue(self, request: PassRequest) -> None:
        with self._ready:
            if self._closed:
                raise BatchError("the engine is closed")
            self._queue.append(request)
            self._ready.notify()

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def _take(self, last: frozenset[int] = frozenset()) -> list[PassRequest] | None:
        """The requests of the next pass (see the module's docstring); None once closed. ``last``: the
        jobs (ids of their models) of this batcher's last pass."""
        with self._ready:
            while True:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return None
                rejoin = time.monotonic() + REJOIN_S
                while last - {id(r.model) for r in self._queue} and (left := rejoin - time.monotonic()) > 0:
                    self._ready.wait(left)
                if self._queue:  # (another batcher may have taken it all meanwhile)
                    break
            batch = [r for r in self._queue if r.passed_over]
            rows = sum(len(r.tokens) for r in batch)
            for request in self._queue:
                if request.passed_over:
                    continue
                if batch and rows + len(request.tokens) > self.max_rows:
                    request.passed_over = True  # left behind once: the next pass takes it whatever its width
                    continue
                batch.append(request)
                rows += len(request.tokens)
            taken = {id(r) for r in batch}
            self._queue = deque(r for r in self._queue if id(r) not in taken)
            return batch

    def _run(self) -> None:
        last: frozenset[int] = frozenset()
        while (batch := self._take(last)) is not None:
            self._pass(batch)
            last = frozenset(id(r.model) for r in batch)

    def _pass(self, batch: list[PassRequest]) -> None:
        try:
            results = extend_batch([r.model for r in batch], [r.tokens for r in batch], [r.parents for r in batch])
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
                self.shared += len(batch) > 1
                self.rows += sum(len(r.tokens) for r in batch)
                self.jobs_per_pass = [*self.jobs_per_pass[-255:], len(batch)]
        for request in batch:
            request.done.set()


class BatchedLM:
    """A job's target cache whose passes go through the engine's ``PassBatcher`` (a
    ``verifier.LanguageModel``: extend, rollback, cached; ``inner`` is the LeanLM fork)."""

    supports_trees = True  # extend_tree and keep_path, as the LeanLM it wraps

    def __init__(self, inner, batcher: PassBatcher) -> None:
        self.inner, self.batcher = inner, batcher
        self.vocab_size, self.max_positions, self.name = inner.vocab_size, inner.max_positions, inner.name

    def cached(self) -> Sequence[int]:
        return self.inner.cached()

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        return self.batcher.extend(self.inner, tokens)

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        return self.batcher.extend(self.inner, tokens, parents)

    def keep_path(self, path: Sequence[int]) -> None:
        self.inner.keep_path(path)

    def rollback(self, n: int) -> None:
        self.inner.rollback(n)
