"""What a shared verification pass costs against its width: the measurement behind the batcher's
row cap (node.target.batching, issue 25).

For J jobs that each need R rows (R = γ + 1 for a verification pass, 1 for a plain step), after a
COST_CONTEXT-token prefix each, this times in one run and interleaved: J passes of R rows, one per
job, and one shared pass of the J·R rows (node.model.kernels.batch.extend_batch). A memory-bound
target reads its weights once per pass, so the shared pass should cost far less than J of them
until its width leaves the memory-bound regime; the cap is the width past which a shared pass
stops being nearly free. Ratios are printed side by side; nothing here is a test.
"""

from __future__ import annotations

import json
import statistics
import time
from functools import partial
from pathlib import Path

from node.lab.bench_local import COST_CONTEXT

ROWS = (1, 7)  # a plain step; a verification pass at γ = 6
JOBS = (1, 2, 4, 8)
REPEATS = 5


def _jobs(target, n: int) -> list:
    """``n`` forks of the target, each holding a different COST_CONTEXT-token prefix."""
    jobs = []
    for j in range(n):
        job = target.fork()
        job.extend([(7 * j + i) % 1000 + 1 for i in range(COST_CONTEXT)])
        jobs.append(job)
    return jobs


def _undo(jobs: list, rows: int) -> None:
    for job in jobs:
        job.rollback(rows)


def _timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(target, jobs_counts=JOBS, rows_counts=ROWS, repeats: int = REPEATS) -> list[dict]:
    """Per (J, R): median ms of J separate R-row passes and of one shared J·R-row pass."""
    from node.model.kernels.batch import extend_batch

    out = []
    for rows in rows_counts:
        for n in jobs_counts:
            jobs = _jobs(target, n)
            new = [[11 + j] * rows for j in range(n)]
            separate, shared = [], []
            for _ in range(repeats):  # interleaved: a noisy machine slows both alike
                separate.append(sum(_timed(partial(job.extend, t)) for job, t in zip(jobs, new, strict=True)))
                _undo(jobs, rows)
                shared.append(_timed(partial(extend_batch, jobs, new)))
                _undo(jobs, rows)
            s_ms, b_ms = 1000 * statistics.median(separate), 1000 * statistics.median(shared)
            out.append({"jobs": n, "rows_each": rows, "width": n * rows, "separate_ms": round(s_ms, 1),
                        "shared_ms": round(b_ms, 1), "throughput_gain": round(s_ms / b_ms, 3)})  # fmt: skip
    return out


def run_bench_batch(pair_name: str, out: Path | None, threads: int = 1) -> list[dict]:
    import torch

    from node.lab.bench_local import load_lab_pair

    torch.set_num_threads(threads)
    target = load_lab_pair(pair_name).target
    target.fork().extend([1] * 8)  # warm up
    rows = measure(target)
    print(f"{'jobs':>5}{'rows':>6}{'width':>7}{'J passes ms':>13}{'shared ms':>11}{'gain':>7}")
    for r in rows:
        print(
            f"{r['jobs']:>5}{r['rows_each']:>6}{r['width']:>7}{r['separate_ms']:>13}{r['shared_ms']:>11}"
            f"{r['throughput_gain']:>7}"
        )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench_batch.json").write_text(
            json.dumps({"pair": pair_name, "threads": threads, "rows": rows}, indent=2)
        )
    return rows
