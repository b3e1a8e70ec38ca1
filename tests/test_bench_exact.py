"""bench-target on an exact target (node.lab.bench_exact): t(1), v(γ), the shared pass and the prefill
are measured on a seeded exact model beside another target, and issue 39's goals are judged from them;
llama.cpp's side is the tested node.lab.llama_cpp (tests/test_llama_cpp.py), left out here."""

from __future__ import annotations

import hashlib
import json

import pytest
from exact_models import TOKENIZER_DIR, write_seeded_gguf

from node.lab.bench_exact import BATCH_OVER_ONE_MAX, T1_OVER_LLAMA_MAX, V_GOAL_GAMMA, goals, run_bench_exact
from node.lab.config import TargetBenchConfig
from node.model.exact.convert import write_exact
from node.model.loading import TINY_TARGET


@pytest.fixture(scope="module")
def exact_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_exact")
    gguf = write_seeded_gguf(root / "seeded.gguf")
    return write_exact(gguf, hashlib.sha256(gguf.read_bytes()).hexdigest(), root / "model", TOKENIZER_DIR)


def test_an_exact_target_is_measured_beside_another_and_judged(exact_dir, tmp_path):
    cfg = TargetBenchConfig(
        exact_dir, max_gamma=V_GOAL_GAMMA, repeats=3, out=tmp_path / "bt.json", compare_dir=TINY_TARGET,
        llama=False, prefill=48, batch_jobs=3,
    )  # fmt: skip
    report = run_bench_exact(cfg)
    assert json.loads(cfg.out.read_text())["ours"]["exact"]["t_target_1_ms"] == report["ours"]["exact"]["t_target_1_ms"]
    assert set(report["ours"]) == {"exact", "compare"} and report["ours"]["exact"]["kernel"] == "exact"
    for side in report["ours"].values():
        assert side["t_target_1_ms"] > 0 and side["prefill_ms"] > 0
        assert sorted(side["v"]) == list(range(1, V_GOAL_GAMMA + 1)) and all(v > 0 for v in side["v"].values())
    exact = report["ours"]["exact"]
    ratio = exact["shared_pass_ms"] / exact["one_job_pass_ms"]
    assert abs(exact["batch_over_one"] - ratio) <= 0.01 * ratio  # rounding only
    assert report["ours"]["compare"]["batch_over_one"] is None  # the tiny float target shares no pass
    assert report["llama_cpp"] is None and report["batch_jobs"] == 3 and report["prefill_tokens"] == 48
    judged = {g["goal"]: g for g in report["goals"]}
    assert judged[f"v({V_GOAL_GAMMA})"]["measured"] == report["ours"]["exact"]["v"][V_GOAL_GAMMA]
    assert [g["holds"] is None for g in report["goals"]] == [True, False, False, True]  # llama.cpp's two


def test_goals_hold_at_their_bound_and_are_missed_past_it():
    exact = {"t_target_1_ms": 110.0, "v": {V_GOAL_GAMMA: 1.31}, "batch_over_one": BATCH_OVER_ONE_MAX, "prefill_ms": 5}
    llama = {"ms_per_token": 100.0, "prefill_ms": 10.0}
    t1, v, batch, prefill = goals(exact, llama)
    assert t1["measured"] == T1_OVER_LLAMA_MAX and t1["holds"] is True
    assert v["holds"] is False and batch["holds"] is True
    assert prefill["measured"] == 0.5 and prefill["holds"] is True
    slower = goals({**exact, "t_target_1_ms": 111.0}, llama)[0]
    assert slower["measured"] == 1.11 and slower["holds"] is False


def test_the_transformers_baselines_are_left_out_for_an_exact_target(exact_dir):
    """bench-local and bench-p2p once died on an exact target (no transformers model to build); now
    their HF modes are left out for it, and kept for a float target (the tiny pair)."""
    from types import SimpleNamespace

    from node.lab.bench_local import HF_ASSISTED, has_hf_model, hf_modes
    from node.model.loading import TINY_DRAFT, load_model_dir

    exact, _ = load_model_dir(exact_dir, "target")
    tiny, _ = load_model_dir(TINY_TARGET, "target")
    draft, _ = load_model_dir(TINY_DRAFT, "draft")
    assert not has_hf_model(exact) and has_hf_model(tiny) and has_hf_model(draft)
    assert hf_modes(SimpleNamespace(target=exact, draft=draft), None, None) == {}
    assert set(hf_modes(SimpleNamespace(target=tiny, draft=draft), None, None)) == {"hf_plain", *HF_ASSISTED}


def test_bench_p2p_judges_a_mode_that_drafted_under_a_token_a_round_without_a_bound():
    """A deadline too short for the drafter leaves rounds with no draft: α cannot be fitted, so there is
    no S bound (bench-p2p once died on it), and the other ratios are still reported."""
    from node.lab.bench_p2p import mode_ratios, speedup_bound

    costs = {"cost_c": 0.35, "t_target_1_ms": 50.0}
    starved = {"mean_draft_length": 0.03, "mean_accepted_length": 1.01, "target_pass_ms_per_round": 51.0}
    assert speedup_bound(starved, costs)["bound"] is None
    fed = {"mean_draft_length": 3.0, "mean_accepted_length": 3.2, "target_pass_ms_per_round": 80.0}
    assert speedup_bound(fed, costs)["bound"] > 1
    rows = {m: {"tokens_per_second": 20.0, "speedup_vs_plain": 1.0} for m in ("plain", "local", "p2p_hostile")}
    rows |= {m: {"tokens_per_second": 22.0, "speedup_vs_plain": 1.1} for m in ("p2p_honest", "p2p_honest_no_overlap")}
    assert "p2p_honest_vs_bound" not in mode_ratios(rows, None) and mode_ratios(rows, 1.1)["p2p_honest_vs_bound"] == 1.0
