"""Verification near the memory limit: what one target pass costs, against its physical floor.

A decode pass reads every weight once, so with a KV cache its cost is bounded below by weight bytes /
memory bandwidth (the roofline model: Williams, Waterman & Patterson, CACM 2009). Scoring γ+1
positions reads the same weights, so a memory-bound pass makes v = t_target(γ+1) / t_target(1)
close to 1, which is what speculation needs (Leviathan et al. 2023, §3.3: the speed-up bound
divides by the verify cost). This measures, in one process and one run:

- the memory bandwidth: a streaming read (``sum``) of a buffer far larger than the caches;
- t_target(1) and v(γ) for γ = 1..max_gamma after a COST_CONTEXT-token prefix, per kernel
  (``plain`` nn.Linear, or ``prepacked`` oneDNN weights) and per thread count;
- the logit drift between one (γ+1)-position pass and γ+1 one-position passes over the same tokens,
  and how many argmaxes flip: the invariance the tolerance band relies on (docs/design.md §4).

Ratios are printed side by side; nothing here is a test.
"""

from __future__ import annotations

import time

import numpy as np

from node.lab.bench_local import COST_CONTEXT, median_seconds, pass_seconds, write_json
from node.lab.config import TargetBenchConfig
from node.models import HFCausalLM, load_model_dir, prepack_linears

BANDWIDTH_BYTES = 1 << 30  # 1 GiB: far past any cache of this CPU
BANDWIDTH_REPEATS = 5
DRIFT_WIDTH = 9  # the widest pass checked for drift (γ = 8)


def weight_bytes(model: HFCausalLM) -> int:
    """Bytes of the weights one pass must read (tied weights counted once)."""
    return sum(p.numel() * p.element_size() for p in model.model.parameters())


def read_bandwidth(threads: int) -> float:
    """Bytes per second of a streaming read with ``threads`` torch threads (median of a few)."""
    import torch

    torch.set_num_threads(threads)
    buffer = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32)
    buffer.sum()  # touch every page once before timing
    return BANDWIDTH_BYTES / median_seconds(buffer.sum, BANDWIDTH_REPEATS)


def shape_drift(model: HFCausalLM, width: int) -> dict:
    """Max |logit difference| between one ``width``-position pass and ``width`` one-position passes
    over the same tokens after a COST_CONTEXT prefix, and the argmax flips between them."""
    context, tokens = list(range(1, COST_CONTEXT + 1)), list(range(7, 7 + width))
    wide = model.fork()
    wide.extend(context)
    together = wide.extend(tokens)  # [width, V]
    narrow = model.fork()
    narrow.extend(context)
    one_by_one = np.stack([narrow.extend([t])[0] for t in tokens])  # [width, V]
    flips = int((together.argmax(axis=1) != one_by_one.argmax(axis=1)).sum())
    return {"width": width, "max_abs_drift": float(np.abs(together - one_by_one).max()), "argmax_flips": flips}


def pass_costs(model: HFCausalLM, max_gamma: int, repeats: int) -> dict:
    """t(1) in ms and v(γ) = t(γ+1)/t(1) for γ = 1..max_gamma."""
    t1 = pass_seconds(model, 1, repeats)
    v = {gamma: pass_seconds(model, gamma + 1, repeats) / t1 for gamma in range(1, max_gamma + 1)}
    return {"t_target_1_ms": round(t1 * 1e3, 3), "v": {g: round(x, 3) for g, x in v.items()}}


def _row(model: HFCausalLM, kernel: str, threads: int, cfg: TargetBenchConfig, floor_s: float) -> dict:
    import torch

    torch.set_num_threads(threads)
    costs = pass_costs(model, cfg.max_gamma, cfg.repeats)
    drift = shape_drift(model, min(DRIFT_WIDTH, cfg.max_gamma + 1))
    over_floor = costs["t_target_1_ms"] / (floor_s * 1e3)
    return {"kernel": kernel, "threads": threads, **costs, "t1_over_floor": round(over_floor, 3), "drift": drift}


def run_bench_target(cfg: TargetBenchConfig) -> dict:
    started = time.perf_counter()
    model, _ = load_model_dir(cfg.model_dir, "target")
    size = weight_bytes(model)
    bandwidth = {threads: read_bandwidth(threads) for threads in cfg.threads}
    best_bandwidth = max(bandwidth.values())
    floor_s = size / best_bandwidth
    rows = []
    for kernel in cfg.kernels:  # plain first: prepacking replaces the model's layers in place
        if kernel == "prepacked":
            prepack_linears(model.model)
        rows.extend(_row(model, kernel, threads, cfg, floor_s) for threads in cfg.threads)
    report = {
        "model_dir": str(cfg.model_dir),
        "weight_bytes": size,
        "bandwidth_gb_s": {t: round(b / 1e9, 2) for t, b in bandwidth.items()},
        "floor_ms": round(floor_s * 1e3, 3),
        "context": COST_CONTEXT,
        "repeats": cfg.repeats,
        "rows": rows,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    _print_report(report, cfg)
    write_json(cfg.out, report)
    return report


def _print_report(report: dict, cfg: TargetBenchConfig) -> None:
    bandwidth = ", ".join(f"{t} thread(s) {b} GB/s" for t, b in report["bandwidth_gb_s"].items())
    print(f"\nweights {report['weight_bytes'] / 1e6:.1f} MB; read bandwidth {bandwidth}")
    print(f"floor (weights / best bandwidth): {report['floor_ms']} ms per pass")
    gammas = range(1, cfg.max_gamma + 1)
    print(f"  {'kernel':<10}{'thr':>4}{'t(1) ms':>9}{'/floor':>8}" + "".join(f"{f'v(γ={g})':>9}" for g in gammas))
    for r in report["rows"]:
        vs = "".join(f"{r['v'][g]:>9}" for g in gammas)
        d = r["drift"]
        print(
            f"  {r['kernel']:<10}{r['threads']:>4}{r['t_target_1_ms']:>9}{r['t1_over_floor']:>8}{vs}"
            f"   drift {d['max_abs_drift']:.1e} ({d['argmax_flips']} flips over {d['width']})"
        )
