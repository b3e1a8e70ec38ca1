"""bench-target on the shipped tiny target: the floor, t(1), v(γ) and the shape drift are measured and
written, for every kernel, side by side; prepacked oneDNN weights keep the logits inside the tolerance band."""

from __future__ import annotations

import json

import numpy as np

from node.lab.bench_target import run_bench_target, shape_drift, weight_bytes
from node.lab.config import TargetBenchConfig
from node.model.kernels import KERNELS
from node.model.kernels.linear import prepack_linears
from node.model.loading import TINY_DRAFT, TINY_TARGET, load_model_dir
from verifier.tolerance import TOLERANCE_DELTA


def test_bench_target_reports_floor_costs_and_drift(tmp_path):
    out = tmp_path / "bt.json"
    cfg = TargetBenchConfig(TINY_TARGET, threads=(1,), max_gamma=2, repeats=2, out=out, draft_dir=TINY_DRAFT)
    report = run_bench_target(cfg)
    floors = {int(t): f for t, f in json.loads(cfg.out.read_text())["floor_ms"].items()}
    assert floors == report["floor_ms"] and floors[1] > 0
    model, _ = load_model_dir(TINY_TARGET, "target")
    assert report["weight_bytes"] == weight_bytes(model) == 4 * sum(p.numel() for p in model.model.parameters())
    assert [r["kernel"] for r in report["rows"]] == list(KERNELS)
    assert report["draft"]["ms_per_token"] > 0 and report["draft"]["model_dir"] == str(TINY_DRAFT)
    for row in report["rows"]:
        assert row["t_target_1_ms"] > 0 and sorted(row["v"]) == [1, 2] and all(v > 0 for v in row["v"].values())
        ratio = row["t_target_1_ms"] / report["floor_ms"][1]
        assert abs(row["t1_over_floor"] - ratio) <= 0.01 * ratio  # rounding only


def test_prepacked_weights_stay_inside_the_band():
    model, _ = load_model_dir(TINY_TARGET, "target")
    context = list(range(1, 65))
    plain = model.fork()
    plain.extend(context)
    before = plain.extend([7, 8, 9, 10, 11])  # [5, V]
    assert prepack_linears(model.model) >= 1
    packed = model.fork()
    packed.extend(context)
    after = packed.extend([7, 8, 9, 10, 11])
    assert float(np.abs(after - before).max()) < TOLERANCE_DELTA
    assert (after.argmax(axis=1) == before.argmax(axis=1)).all()
    drift = shape_drift(model, 5)
    assert drift["max_abs_drift"] < TOLERANCE_DELTA and drift["argmax_flips"] == 0
