"""Batched verification's forward (node.model.kernels.batch): one pass over several jobs' rows gives
each job bit for bit the logits of its own pass, on the served kernel (the packed qwen2.5-coder
target), for 1-4 jobs of different lengths and widths; and its KV caches stay each job's own, so
the passes after it agree too."""

from __future__ import annotations

import numpy as np
import pytest

from node.model.kernels.batch import BatchError, extend_batch

pytestmark = pytest.mark.slow(seconds=40)

# four jobs: (prompt, the rows of a first verification pass, of a second); lengths all differ
PROMPTS = [[9707, 11, 1879], [872, 525, 264, 3974, 13, 1234, 77], [151644, 872, 198, 5501, 14], [40, 1079]]
FIRST = [[2661, 3110, 13, 1077, 525], [198], [8, 9, 10], [1573, 3110]]
SECOND = [[11], [264, 3974, 1879, 9707], [13, 14], [15, 16, 17, 18, 19, 20]]


@pytest.fixture(scope="module")
def target():
    from node.lab.bench_local import load_lab_pair

    return load_lab_pair("qwen2.5-coder").target


def solo(target, steps: list[list[int]]) -> list[np.ndarray]:
    job = target.fork()
    return [job.extend(step) for step in steps]


@pytest.mark.parametrize("n_jobs", [1, 2, 4])
def test_a_shared_pass_gives_each_job_its_own_logits_bit_for_bit(target, n_jobs):
    expected = [solo(target, [PROMPTS[j], FIRST[j], SECOND[j]]) for j in range(n_jobs)]
    jobs = [target.fork() for _ in range(n_jobs)]
    for step, rows in enumerate((PROMPTS, FIRST, SECOND)):  # prefills, then two verification passes
        got = extend_batch(jobs, rows[:n_jobs])
        for j in range(n_jobs):
            assert got[j].shape == expected[j][step].shape
            assert np.array_equal(got[j], expected[j][step]), f"job {j}, pass {step}: the shared pass changed its bits"
    for j, job in enumerate(jobs):
        assert list(job.cached()) == PROMPTS[j] + FIRST[j] + SECOND[j]


def test_jobs_may_join_and_leave_between_passes(target):
    """Job 0 runs alone, then shares a pass with job 1 (its prefill), then after a rollback (a
    rejected draft) job 1 passes alone: every pass equals the job's own."""
    expected0 = solo(target, [PROMPTS[0], FIRST[0]])
    expected1 = solo(target, [PROMPTS[1], FIRST[1][:1], SECOND[1]])
    a, b = target.fork(), target.fork()
    assert np.array_equal(extend_batch([a], [PROMPTS[0]])[0], expected0[0])
    got_a, got_b = extend_batch([a, b], [FIRST[0], PROMPTS[1]])
    assert np.array_equal(got_a, expected0[1]) and np.array_equal(got_b, expected1[0])
    b.extend(FIRST[1] + [5, 6])
    b.rollback(2)  # the two rejected positions leave the cache; the next pass overwrites them
    assert np.array_equal(extend_batch([b], [SECOND[1]])[0], expected1[2])


def test_jobs_that_cannot_share_a_pass_are_refused(target, pair):
    from node.lab.bench_local import load_lab_pair

    job = target.fork()
    with pytest.raises(BatchError, match="twice"):
        extend_batch([job, job], [[1], [2]])
    with pytest.raises(BatchError, match="at least one token"):
        extend_batch([job, target.fork()], [[1], []])
    with pytest.raises(BatchError, match="share their weights"):
        extend_batch([job, load_lab_pair("qwen2.5-coder").draft.fork()], [[1], [2]])
    tiny = pair.target.fork()  # the tiny pair's HF model: its wide passes may take another kernel
    with pytest.raises(BatchError, match=r"lean forward|shape-invariant"):
        extend_batch([tiny], [[1]])
    assert list(job.cached()) == []  # a refused pass changes nothing
