"""The serving benchmarks on the qwen2.5-coder pair, cut short: ``bench-serve`` (concurrent clients,
plain and speculative, shared passes or not) and ``bench-trees`` (the draft, prompt lookup and both
as one tree; in process, and over libp2p with each drafter a peer of its own) run every mode side by
side, write their JSON, and every mode's outputs equal plain decoding's. Speed is what the full runs
measure (docs/target-performance.md), never asserted here."""

from __future__ import annotations

import json

import pytest

from node.lab.bench_serve import MODES as SERVE_MODES
from node.lab.bench_serve import run_bench_serve
from node.lab.bench_trees import MODES as TREE_MODES
from node.lab.bench_trees import run_bench_trees
from node.lab.bench_trees_p2p import P2P_JSON, P2P_MODES, run_bench_trees_p2p
from node.lab.report_serving import trees_section

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
    assert report["modes"]["plain"]["tokens_per_pass"] == report["modes"]["plain"]["rows_per_pass"] == 1.0
    assert report["best_single"] in ("draft", "lookup") and report["tree_tokens_per_pass_ratio"] > 0


def test_bench_trees_p2p_runs_every_mode_over_libp2p_and_credits_each_peer_its_own_tokens(tmp_path):
    # the tiny pair: four targets and three drafter peers start one after the other
    report = run_bench_trees_p2p(tokens=12, n_prompts=2, pair="tiny", out=tmp_path)
    assert json.loads((tmp_path / P2P_JSON).read_text()) == report
    assert report["transport"] == "libp2p" and list(report["modes"]) == list(P2P_MODES)
    assert all(r["identical"] for r in report["modes"].values()), report["modes"]
    assert report["modes"]["plain"]["tokens_per_pass"] == 1.0  # (no draft rounds: no rows per pass)
    assert report["modes"]["tree"]["rows_per_pass"] >= report["modes"]["tree"]["tokens_per_pass"]
    credits = report["credits"]
    assert not credits["plain"] and set(credits["draft"]) <= {"honest"} and set(credits["lookup"]) <= {"lookup"}
    assert sum(credits["draft"].values()) > 0  # the tiny draft accepts most of its tokens greedily
    assert set(credits["tree"]) <= {"honest", "lookup"}
    assert "`specmarket bench-trees --p2p`" in trees_section(report)
