"""The serving benchmarks on the qwen2.5-coder pair, cut short: ``bench-serve`` (concurrent clients,
plain and speculative, shared passes or not) and ``bench-trees`` (the draft, prompt lookup and both
as one tree) run every mode side by side, write their JSON, and every mode's outputs equal plain
decoding's. Speed is what the full runs measure (docs/target-performance.md), never asserted here."""

from __future__ import annotations

import json

import pytest

from node.lab.bench_serve import MODES as SERVE_MODES
from node.lab.bench_serve import run_bench_serve
from node.lab.bench_trees import MODES as TREE_MODES
from node.lab.bench_trees import run_bench_trees

pytestmark = pytest.mark.slow(seconds=60)


def test_bench_serve_runs_every_mode_and_every_output_is_plain_decodings(tmp_path):
    report = run_bench_serve(tokens=6, clients=(1, 4), out=tmp_path)
    assert json.loads((tmp_path / "bench_serve.json").read_text()) == report
    for n in ("1", "4"):
        row = report["clients"][n]
        assert list(row) == list(SERVE_MODES)
        for mode, r in row.items():
            assert r["identical"], f"{n} clients, {mode}: an output differs from plain decoding's"
            assert r["tokens"] == 6 * int(n) and r["tokens_per_s"] > 0 and r["p95_ms"] >= r["p50_ms"] > 0
        assert row["plain"]["batched_passes"] == 0 and row["plain-batched"]["batched_passes"] > 0
    assert all(report[f"{kind}_throughput_ratio_4"] > 0 for kind in ("spec", "remote"))


def test_bench_trees_runs_every_mode_and_every_output_is_plain_decodings(tmp_path):
    report = run_bench_trees(tokens=6, n_prompts=2, out=tmp_path)
    assert json.loads((tmp_path / "bench_trees.json").read_text()) == report
    assert list(report["modes"]) == list(TREE_MODES)
    assert all(r["identical"] for r in report["modes"].values())
    assert report["modes"]["plain"]["tokens_per_pass"] == 1.0
    assert report["best_single"] in ("draft", "lookup") and report["tree_tokens_per_pass_ratio"] > 0
