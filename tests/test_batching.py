"""Batched verification in the engine (node.target.batching), on the served kernel (the packed
qwen2.5-coder target): concurrent jobs share passes, each job's answer is token for token what it
is alone, and one request that breaks a shared pass fails alone."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
import trio

from node.target.batching import BatchedLM, PassBatcher
from node.target.engine import CompletionRequest, Engine

pytestmark = pytest.mark.slow(seconds=60)

REQUESTS = [  # different prompts, lengths and temperatures: the jobs drift in and out of step
    CompletionRequest("def add(a, b):\n", max_tokens=6, temperature=0.0, seed=1),
    CompletionRequest("Explain what a hash table is.", max_tokens=9, temperature=0.8, seed=2),
    CompletionRequest("import os\n", max_tokens=4, temperature=1.0, seed=3),
]


@pytest.fixture(scope="module")
def qwen():
    from node.lab.bench_local import load_lab_pair

    return load_lab_pair("qwen2.5-coder")


async def _all(engine: Engine, requests: list[CompletionRequest]) -> list[tuple[int, ...]]:
    out: list = [None] * len(requests)

    async def one(i: int) -> None:
        out[i] = (await engine.complete(requests[i])).tokens

    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(one, i)
    return out


@pytest.fixture(scope="module")
def expected(qwen) -> list[tuple[int, ...]]:
    """Each request's answer alone (batching off)."""
    alone = Engine(qwen, model_name="q", gamma=4, batch_rows=0, plain_pass_s=0.25)
    assert alone.batcher is None
    return [trio.run(_all, alone, [r])[0] for r in REQUESTS]


def test_concurrent_jobs_share_passes_and_each_answer_is_its_own(qwen, expected):
    shared = Engine(qwen, model_name="q", gamma=4, batch_rows=32, batch_workers=1, plain_pass_s=0.25)
    assert shared.batcher is not None
    got = trio.run(_all, shared, REQUESTS)
    assert got == expected, "a shared pass changed an answer"
    solo_passes = sum(r.max_tokens for r in REQUESTS)  # plain decoding: one pass per token
    assert shared.batcher.passes < solo_passes, (shared.batcher.passes, solo_passes)
    assert max(shared.batcher.jobs_per_pass) >= 2, shared.batcher.jobs_per_pass


def test_a_request_that_breaks_a_shared_pass_fails_alone(qwen):
    """A job whose pass raises (a cancelled or broken job, simulated by a cache whose attention
    fails) gets its error; the other jobs of that pass get their own logits, bit for bit."""
    prompts = [[9707, 11, 1879], [872, 525, 264, 3974], [40, 1079, 13]]
    expected = [qwen.target.fork().extend(p) for p in prompts]
    batcher = PassBatcher(max_rows=64, workers=2)  # the broken job's pass may be shared or not: both hold
    jobs = [qwen.target.fork() for _ in prompts]

    def broken(*args, **kwargs):
        raise RuntimeError("this job's pass breaks")

    jobs[1].attend = broken
    results: dict[int, object] = {}

    def run(i: int) -> None:
        try:
            results[i] = BatchedLM(jobs[i], batcher).extend(prompts[i])
        except RuntimeError as exc:
            results[i] = exc

    import threading

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    batcher.close()
    assert isinstance(results[1], RuntimeError)
    for i in (0, 2):
        assert np.array_equal(results[i], expected[i]), f"job {i} was failed or changed by job 1's broken pass"
        assert list(jobs[i].cached()) == prompts[i]
    assert list(jobs[1].cached()) == []


def test_passes_on_several_cores_run_side_by_side_and_each_answer_is_its_own(qwen, expected):
    """Two batcher threads (one per core): jobs that ran their passes side by side before batching
    still do; every answer is still the answer alone."""
    two = Engine(qwen, model_name="q", gamma=4, batch_rows=32, batch_workers=2, plain_pass_s=0.25)
    assert trio.run(_all, two, REQUESTS) == expected
    two.close()


def test_a_request_that_cannot_run_is_refused_before_it_joins_a_pass(qwen):
    batcher = PassBatcher()
    job = qwen.target.fork()
    from verifier.errors import ContextTooLong

    with pytest.raises(ContextTooLong):
        batcher.extend(job, [1] * (job.max_positions + 1))
    assert batcher.passes == 0 and list(job.cached()) == []
    batcher.close()


def test_a_job_never_waits_more_than_one_pass_for_a_slot():
    """Six queued verification passes of 13 rows (a tree each) against a cap of 32: the first pass
    takes two; the second takes the four it left behind, past the cap, and leaves behind only a
    request that arrived after the first pass, which the third takes."""
    from node.target.batching import PassRequest

    batcher = PassBatcher(max_rows=32, start=False)
    queued = [PassRequest(None, [1] * 13, None) for _ in range(6)]
    for request in queued:
        batcher._enqueue(request)
    assert [id(r) for r in batcher._take()] == [id(r) for r in queued[:2]]
    late = PassRequest(None, [1] * 5, None)
    batcher._enqueue(late)
    assert [id(r) for r in batcher._take()] == [id(r) for r in queued[2:]]
    assert [id(r) for r in batcher._take()] == [id(late)]
    wide = PassRequest(None, [1] * 40, None)  # a prefill wider than the cap runs alone, not never
    batcher._enqueue(wide)
    assert [id(r) for r in batcher._take()] == [id(wide)]


class _Late:
    """A proposer whose drafts are late once: it answers only after the batcher ran ``passes`` more
    passes (the other job's), or after ``limit_s`` if the batch waits for it."""

    name = "late"

    def __init__(self, inner, batcher: PassBatcher, passes: int, limit_s: float = 60.0) -> None:
        self.inner, self.batcher, self.passes, self.limit_s = inner, batcher, passes, limit_s
        self.passes_while_late: int | None = None

    def propose(self, context, **kwargs):
        if self.passes_while_late is None and kwargs["start"] >= 2:
            before, give_up = self.batcher.passes, time.monotonic() + self.limit_s
            while self.batcher.passes - before < self.passes and time.monotonic() < give_up:
                time.sleep(0.01)
            self.passes_while_late = self.batcher.passes - before
        return self.inner.propose(context, **kwargs)

    def finish(self, context) -> dict[str, int]:
        return {}

    def timing(self) -> dict[str, float]:
        return {}


def test_a_late_drafter_holds_no_batch_and_a_plain_job_shares_passes(qwen, expected):
    """Job 1 decodes plain, job 0 with a draft that is late once, until three more passes ran (of
    job 1: if the batch waited for the late drafts, none would run and the drafts would come after a
    minute); the two jobs share passes, and both answers are each job's answer alone."""
    from contextlib import asynccontextmanager

    from verifier.proposers import LocalDraftProposer

    engine = Engine(qwen, model_name="q", gamma=4, batch_rows=32, batch_workers=1, plain_pass_s=0.25)
    slow = _Late(LocalDraftProposer(qwen.draft.fork()), engine.batcher, passes=3)

    class Backend:
        @asynccontextmanager
        async def job(self, job_id, params, seed, gamma, max_tokens):
            yield slow if params.temperature == 0.8 else None  # REQUESTS[1] drafts; the others decode plain

    engine.drafting = Backend()
    requests = [REQUESTS[1], replace(REQUESTS[0], max_tokens=20)]
    alone = Engine(qwen, model_name="q", gamma=4, batch_rows=0, plain_pass_s=0.25)
    long_plain = trio.run(_all, alone, requests[1:])[0]
    assert trio.run(_all, engine, requests) == [expected[1], long_plain]
    assert slow.passes_while_late >= 3, "a job waiting for its drafts held the other job's passes"
    assert max(engine.batcher.jobs_per_pass) == 2, "the plain job never shared a pass with the speculative one"
    engine.close()
