"""`bench-target` on an exact target (node.model.exact; the CLI picks this for an exact directory):
issue 39's goals, side by side with llama.cpp.

One run, one thread, one core (this process and llama-bench pinned to the same CPU), on the published
GGUF the exact directory serves:

- t(1): one decoding step after COST_CONTEXT tokens, against llama.cpp's token time (``llama-bench
  -n 64``: 64 tokens generated from an empty context, so its mean context is 32 tokens);
- v(γ) = t(γ+1) / t(1), γ = 1..max_gamma;
- a shared pass of BATCH_JOBS jobs × (γ+1) rows against one job's (γ+1)-row pass (node.model.kernels.batch);
- the prefill of a PREFILL-token prompt from an empty cache, against llama.cpp's ``pp512``;
- optionally another target directory (``--compare``, e.g. the float16 target) timed pass by pass
  beside the exact one.

Goals are named constants; the table says which hold. Nothing here is a test: the ratios are measured,
side by side, in one run (a noisy machine slows both sides alike where passes interleave).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from node.lab.bench_local import COST_CONTEXT, write_json
from node.lab.bench_target import interleaved_pass_ms
from node.lab.config import TargetBenchConfig
from node.model.loading import load_model_dir

# issue 39's goals for the exact target (one thread)
T1_OVER_LLAMA_MAX = 1.1  # t(1) against llama.cpp's one-thread token time on the same GGUF
V_GOAL_GAMMA, V_GOAL_MAX = 6, 1.3  # v(6)
BATCH_OVER_ONE_MAX = 1.6  # one shared pass of BATCH_JOBS × 7 rows against one 7-row pass
PREFILL_OVER_LLAMA_MAX = 1.2  # the prompt's prefill against llama.cpp's pp at the same length
LLAMA_GEN_TOKENS = 64  # llama-bench -n
PREFILL_REPEATS = 3


@contextmanager
def one_core(cpu: int) -> Iterator[None]:
    """This process on ``cpu`` alone (as llama-bench is pinned), and torch on one thread, meanwhile."""
    import torch

    allowed, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)
        torch.set_num_threads(threads)


def batch_ms(model, jobs: int, rows: int, repeats: int) -> tuple[float, float]:
    """Median ms of one job's ``rows``-row pass and of one shared pass of ``jobs`` such jobs (each after
    its own COST_CONTEXT-token prefix), interleaved."""
    from node.model.kernels.batch import extend_batch

    forks = []
    for j in range(jobs):
        fork = model.fork()
        fork.extend([1 + (j + i) % 1000 for i in range(COST_CONTEXT)])
        forks.append(fork)
    tokens = [list(range(7, 7 + rows))] * jobs
    one, shared = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        forks[0].extend(tokens[0])
        one.append(time.perf_counter() - started)
        forks[0].rollback(rows)
        started = time.perf_counter()
        extend_batch(forks, tokens)
        shared.append(time.perf_counter() - started)
        for fork in forks:
            fork.rollback(rows)
    return statistics.median(one) * 1e3, statistics.median(shared) * 1e3


def prefill_ms(model, length: int, repeats: int = PREFILL_REPEATS) -> float:
    """Median ms of a ``length``-token prompt's prefill from an empty cache (one pass)."""
    samples = []
    for _ in range(repeats):
        model.reset()
        started = time.perf_counter()
        model.extend([1 + i % 1000 for i in range(length)])
        samples.append(time.perf_counter() - started)
    model.reset()
    return statistics.median(samples) * 1e3


def llama_side(cfg: TargetBenchConfig) -> dict | None:
    """llama.cpp's one-thread numbers on the exact directory's GGUF (None where --no-llama)."""
    if not cfg.llama:
        return None
    from node.lab.llama_cpp import ensure_llama_bench, run_llama_bench

    binary = ensure_llama_bench()
    r = run_llama_bench(
        binary, Path(cfg.model_dir) / "model.gguf", 1, cfg.prefill, LLAMA_GEN_TOKENS, cfg.llama_repeats, bench_cpu()
    )
    return {
        "version": r.version,
        "cpu": r.cpu_info,
        "command": " ".join(r.command),
        "ms_per_token": round(r.ms_per_token, 3),
        "tg_tokens_per_s": round(r.tg_tokens_per_s, 2),
        "prefill_ms": round(r.prefill_ms, 1),
        "pp_tokens_per_s": round(r.pp_tokens_per_s, 2),
    }


def ours(cfg: TargetBenchConfig) -> dict:
    """The exact target's (and the --compare directory's) side: passes, batch and prefill."""
    models = {"exact": load_model_dir(cfg.model_dir, "target")[0]}
    if cfg.compare_dir is not None:
        models["compare"] = load_model_dir(cfg.compare_dir, "comparison target", "skinny")[0]
    by_width = interleaved_pass_ms(models, range(1, cfg.max_gamma + 2), cfg.repeats)
    rows = V_GOAL_GAMMA + 1
    side = {}
    for name, model in models.items():
        t1 = by_width[name][1]
        side[name] = {
            "kernel": model.kernel,
            "t_target_1_ms": round(t1, 3),
            "v": {g: round(by_width[name][g + 1] / t1, 3) for g in range(1, cfg.max_gamma + 1)},
            **batch_fields(model, cfg.batch_jobs, rows, max(3, cfg.repeats // 3)),
            "prefill_ms": round(prefill_ms(model, cfg.prefill), 1),
        }
    return side


def batch_fields(model, jobs: int, rows: int, repeats: int) -> dict:
    """batch_ms's times and their ratio; None for a model whose caches cannot share a pass."""
    from node.model.kernels.batch import BatchError

    try:
        one, shared = batch_ms(model, jobs, rows, repeats)
    except BatchError:
        return {"one_job_pass_ms": None, "shared_pass_ms": None, "batch_over_one": None}
    return {
        "one_job_pass_ms": round(one, 2),
        "shared_pass_ms": round(shared, 2),
        "batch_over_one": round(shared / one, 3),
    }


def goals(exact: dict, llama: dict | None) -> list[dict]:
    """Each goal: its measured ratio, its bound, and whether it holds (None: not measured)."""

    def row(name: str, value: float | None, bound: float) -> dict:
        held = None if value is None else value <= bound
        return {"goal": name, "measured": None if value is None else round(value, 3), "bound": bound, "holds": held}

    return [
        row(
            "t(1) / llama.cpp's token time", llama and exact["t_target_1_ms"] / llama["ms_per_token"], T1_OVER_LLAMA_MAX
        ),
        row(f"v({V_GOAL_GAMMA})", exact["v"].get(V_GOAL_GAMMA), V_GOAL_MAX),
        row("shared pass of jobs × 7 rows / one 7-row pass", exact["batch_over_one"], BATCH_OVER_ONE_MAX),
        row("prefill / llama.cpp's pp", llama and exact["prefill_ms"] / llama["prefill_ms"], PREFILL_OVER_LLAMA_MAX),
    ]


def bench_cpu() -> int:
    """The core both sides run on: the first this process may use (`taskset -c N` picks it)."""
    return min(os.sched_getaffinity(0))


def run_bench_exact(cfg: TargetBenchConfig) -> dict:
    started = time.perf_counter()
    with one_core(bench_cpu()):
        side = ours(cfg)
        llama = llama_side(cfg)
    report = {
        "model_dir": str(cfg.model_dir),
        "compare_dir": None if cfg.compare_dir is None else str(cfg.compare_dir),
        "cpu": bench_cpu(),
        "context": COST_CONTEXT,
        "prefill_tokens": cfg.prefill,
        "batch_jobs": cfg.batch_jobs,
        "repeats": cfg.repeats,
        "ours": side,
        "llama_cpp": llama,
        "goals": goals(side["exact"], llama),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    print_exact_report(report)
    write_json(cfg.out, report)
    return report


def print_exact_report(report: dict) -> None:
    print(f"\none thread on CPU {report['cpu']}; passes after {report['context']} tokens; medians")
    for name, s in report["ours"].items():
        vs = " ".join(f"v({g})={v}" for g, v in s["v"].items())
        print(
            f"  {name:<8} ({s['kernel']}) t(1) {s['t_target_1_ms']} ms  {vs}\n"
            f"           {report['batch_jobs']} jobs × 7 rows {s['shared_pass_ms']} ms against one job's "
            f"{s['one_job_pass_ms']} ms ({s['batch_over_one']}×); prefill {report['prefill_tokens']} tokens "
            f"{s['prefill_ms'] / 1e3:.2f} s"
        )  # (None: that model's caches cannot share a pass)
    llama = report["llama_cpp"]
    if llama is not None:
        print(
            f"  llama.cpp {llama['version']}: {llama['ms_per_token']} ms a token ({llama['tg_tokens_per_s']} tok/s), "
            f"pp{report['prefill_tokens']} {llama['prefill_ms'] / 1e3:.2f} s\n    {llama['command']}"
        )
    print("goals:")
    for g in report["goals"]:
        verdict = {True: "holds", False: "MISSED", None: "not measured"}[g["holds"]]
        print(f"  {g['goal']:<48} {g['measured']!s:>8} ≤ {g['bound']:<5} {verdict}")
