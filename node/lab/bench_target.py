"""Verification near the memory limit: what one target pass costs, against its physical floor.

A decode pass reads every weight once, so with a KV cache its cost is bounded below by weight bytes /
memory bandwidth (the roofline model: Williams, Waterman & Patterson, CACM 2009). Scoring γ+1
positions reads the same weights, so a memory-bound pass makes v = t_target(γ+1) / t_target(1)
close to 1, which is what speculation needs (Leviathan et al. 2023, §3.3: the speed-up bound
divides by the verify cost). This measures, in one process and one run:

- the memory bandwidth: a streaming read (``sum``) of a buffer far larger than the caches;
- t_target(1) and v(γ) for γ = 1..max_gamma after a COST_CONTEXT-token prefix, per linear-layer
  kernel (node.model.kernels: ``skinny``, ``plain`` nn.Linear, ``prepacked`` oneDNN weights) and per
  thread count. The kernels' passes are interleaved (one pass of each in turn), so that a noisy
  machine slows them alike and their ratios hold;
- the logit drift between one (γ+1)-position pass and γ+1 one-position passes over the same tokens,
  and how many argmaxes flip: the invariance the tolerance band relies on (docs/design.md §4).

Ratios are printed side by side; nothing here is a test.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from node.lab.bench_local import COST_CONTEXT, median_seconds, write_json
from node.lab.config import TargetBenchConfig
from node.model.adapter import HFCausalLM
from node.model.loading import load_model_dir

BANDWIDTH_BYTES = 1 << 30  # 1 GiB: far past any cache of this CPU
BANDWIDTH_REPEATS = 5
DRIFT_WIDTH = 9  # the widest pass checked for drift (γ = 8)


def weight_bytes(model: HFCausalLM) -> int:
    """Bytes of the weights one pass must read (tied weights counted once; for a packed model, every
    tensor but the embedding table, of which a pass reads only its tokens' rows)."""
    if isinstance(getattr(getattr(model, "weights", None), "pass_bytes", None), int):
        return model.weights.pass_bytes
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


def interleaved_pass_ms(models: dict[str, HFCausalLM], widths: range, repeats: int) -> dict[str, dict[int, float]]:
    """Median ms of one n-position pass for every model and width, after a COST_CONTEXT prefix: the
    models and the widths take turns pass by pass (one pass of each width of each model per repeat), so
    machine noise falls on all of them, and on v's numerator and denominator, alike."""
    context = list(range(1, COST_CONTEXT + 1))
    for model in models.values():
        model.reset()
        model.extend(context)
    samples: dict[str, dict[int, list[float]]] = {name: {n: [] for n in widths} for name in models}
    for _ in range(repeats):
        for n in widths:
            tokens = list(range(7, 7 + n))
            for name, model in models.items():
                started = time.perf_counter()
                model.extend(tokens)
                samples[name][n].append(time.perf_counter() - started)
                model.rollback(n)
    return {name: {n: statistics.median(s) * 1e3 for n, s in by_width.items()} for name, by_width in samples.items()}


def _rows(models: dict[str, HFCausalLM], threads: int, cfg: TargetBenchConfig, floor_s: float) -> list[dict]:
    import torch

    torch.set_num_threads(threads)
    pass_ms = interleaved_pass_ms(models, range(1, cfg.max_gamma + 2), cfg.repeats)
    rows = []
    for kernel, by_width in pass_ms.items():
        t1 = by_width[1]
        v = {gamma: round(by_width[gamma + 1] / t1, 3) for gamma in range(1, cfg.max_gamma + 1)}
        drift = shape_drift(models[kernel], min(DRIFT_WIDTH, cfg.max_gamma + 1))
        over_floor = round(t1 / (floor_s * 1e3), 3)
        rows.append(
            {
                "kernel": kernel,
                "threads": threads,
                "t_target_1_ms": round(t1, 3),
                "v": v,
                "t1_over_floor": over_floor,
                "drift": drift,
            }
        )
    return rows


def run_bench_target(cfg: TargetBenchConfig) -> dict:
    started = time.perf_counter()
    models = {kernel: load_model_dir(cfg.model_dir, "target", kernel)[0] for kernel in cfg.kernels}
    in_use = {kernel: model.kernel for kernel, model in models.items()}
    models = {kernel: model for kernel, model in models.items() if in_use[kernel] == kernel}  # drop fallbacks
    size = weight_bytes(next(iter(models.values())))
    bandwidth = {threads: read_bandwidth(threads) for threads in cfg.threads}
    floor_s = {threads: size / b for threads, b in bandwidth.items()}
    rows = [row for threads in cfg.threads for row in _rows(models, threads, cfg, floor_s[threads])]
    draft = _draft_pass_ms(cfg) if cfg.draft_dir is not None else None
    report = {
        "draft": draft,
        "model_dir": str(cfg.model_dir),
        "weight_bytes": size,
        "bandwidth_gb_s": {t: round(b / 1e9, 2) for t, b in bandwidth.items()},
        "floor_ms": {t: round(f * 1e3, 3) for t, f in floor_s.items()},
        "kernels_unavailable": sorted(k for k, used in in_use.items() if used != k),
        "context": COST_CONTEXT,
        "repeats": cfg.repeats,
        "rows": rows,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    _print_report(report, cfg)
    write_json(cfg.out, report)
    return report


def _draft_pass_ms(cfg: TargetBenchConfig) -> dict:
    """The draft's one-position pass (a drafted token) at one thread, as a drafter peer runs it."""
    import torch

    torch.set_num_threads(1)
    draft = load_model_dir(cfg.draft_dir, "draft", "skinny")[0]
    by_width = interleaved_pass_ms({"draft": draft}, range(1, 2), cfg.repeats)["draft"]
    return {"model_dir": str(cfg.draft_dir), "weight_bytes": weight_bytes(draft), "ms_per_token": round(by_width[1], 3)}


def _print_report(report: dict, cfg: TargetBenchConfig) -> None:
    bandwidth = ", ".join(f"{t} thread(s) {b} GB/s" for t, b in report["bandwidth_gb_s"].items())
    print(f"\nweights {report['weight_bytes'] / 1e6:.1f} MB; read bandwidth {bandwidth}")
    floors = ", ".join(f"{t} thread(s) {f} ms" for t, f in report["floor_ms"].items())
    print(f"floor (weights / bandwidth at that thread count): {floors} per pass")
    if report["kernels_unavailable"]:
        print(f"not measured (cannot run here): {', '.join(report['kernels_unavailable'])}")
    gammas = range(1, cfg.max_gamma + 1)
    print(f"  {'kernel':<10}{'thr':>4}{'t(1) ms':>9}{'/floor':>8}" + "".join(f"{f'v(γ={g})':>9}" for g in gammas))
    for r in report["rows"]:
        vs = "".join(f"{r['v'][g]:>9}" for g in gammas)
        d = r["drift"]
        print(
            f"  {r['kernel']:<10}{r['threads']:>4}{r['t_target_1_ms']:>9}{r['t1_over_floor']:>8}{vs}"
            f"   drift {d['max_abs_drift']:.1e} ({d['argmax_flips']} flips over {d['width']})"
        )
    if report["draft"] is not None:
        d = report["draft"]
        print(f"draft: {d['ms_per_token']} ms per drafted token, one thread ({d['weight_bytes'] / 1e6:.0f} MB read)")
