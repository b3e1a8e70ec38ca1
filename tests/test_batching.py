"""Batched verification in the engine (node.target.batching), on the served kernel (the packed
qwen2.5-coder target): concurrent jobs share passes, each job's answer is token for token what it
is alone, and one request that breaks a shared pass fails alone."""

from __future__ import annotations

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
