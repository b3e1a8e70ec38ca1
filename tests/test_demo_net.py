"""`specmarket demo-net --quick` (what CI runs of `make demo`): anvil, deployment, bonded targets, four
drafter peers, two slashed cheating operators, all as real processes; the report's numbers are
checked for internal consistency; every process is gone afterwards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from node.chain.deployment import DEFAULT_THRESHOLD, BondConfig
from node.target.engine import FLIP_AT
from verifier.tree import DEFAULT_TREE_NODES

pytestmark = pytest.mark.slow(seconds=120)  # scheduled first (tests/conftest.py)

DEMO_TIMEOUT_S = 900
INTERRUPT_AFTER_S = 3.0  # into the targets' start-up (imports and model loading take longer)
STOP_WAIT_S = 60
INTERRUPTED_EXIT = 130  # what `specmarket` returns on KeyboardInterrupt
CALLDATA_GAS_SLACK = 400  # signatures and addresses differ per run: a zero byte costs 4 gas, others 16
FORGED_FREQ = 0.99  # the textbook rule emits the lying drafter's token this often at least
TV_NOISE_SLACK = 0.05  # GUMBEL's distance from the target stays within sampling noise (1000 seeds)
MIN_PNG_BYTES = 5_000


def test_quick_networked_demo_end_to_end(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "node", "demo-net", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "demo_net.json").read_text())
    check_serving(result)
    check_trust_budget(result)
    check_report(tmp_path, result)
    leftovers = subprocess.run(["pgrep", "-f", "specmarket_demo_"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left running: {leftovers.stdout}"


def check_serving(result: dict) -> None:
    """Same seeds, same outputs; the target still scores every token; credits are accepted drafts."""
    spec, plain = result["with_speculation"], result["without_speculation"]
    assert result["identical_outputs"] and spec["tokens_per_answer"] == plain["tokens_per_answer"]
    assert spec["output_hashes"] == plain["output_hashes"]
    rows = result["derived"]["rows"]
    assert rows["with_speculation"]["positions_per_token"] >= rows["without_speculation"]["positions_per_token"]
    assert rows["without_speculation"]["passes_per_token"] == 1.0  # plain decoding: one pass per token
    assert spec["target_passes"] < plain["target_passes"] and spec["draft_tokens_accepted"] > 0
    assert plain["draft_tokens_proposed"] == 0
    # the drafting timings reach the JSON
    assert spec["target_pass_seconds"] > 0 and plain["target_pass_seconds"] > 0
    assert spec["draft_answers"] + spec["draft_early_hits"] > 0 and plain["draft_answers"] == 0
    assert spec["draft_round_trip_ms_per_answer"] >= spec["draft_transport_ms_per_answer"] >= 0
    # every accepted token is a drafter's credit, but for those only the target's own lookup branch proposed
    assert (
        sum(d["accepted"] for d in result["drafters"]) + spec["lookup_tokens_accepted"] == spec["draft_tokens_accepted"]
    )
    # every round's record (GET /api/jobs/{id}/rounds) reached the JSON, and they add up to the stats
    rounds = spec["rounds"]
    assert len(rounds) == spec["draft_rounds"] and sum(r["drafted"] for r in rounds) == spec["draft_tokens_proposed"]
    assert sum(r["accepted"] for r in rounds) == spec["draft_tokens_accepted"]
    # a round verifies one tree of the drafters' answers and the target's lookup branch: at most the cap of nodes
    assert max(r["drafted"] for r in rounds) <= DEFAULT_TREE_NODES
    for row in (spec, plain):
        assert row["answers"] <= row["first_chunk_tokens"] < row["tokens"] and row["first_chunk_seconds"] > 0
    sweep = result["local_sweep"]
    assert [p["gamma"] for p in sweep] == [1, 2, 4, 8] and all(p["identical"] for p in sweep)
    by_strategy = {d["name"]: d for d in result["drafters"]}
    assert all(d["accepted"] == 0 for name, d in by_strategy.items() if "honest" not in name)
    assert by_strategy["drafter3-garbage"]["errors"] >= 1


def check_trust_budget(result: dict) -> None:
    """Each cheat slashed exactly the configured amount; checking costs the same both ways."""
    cfg = BondConfig()
    assert result["bond_config"]["slash_amount"] == cfg.slash_amount
    reward = cfg.slash_amount * cfg.challenger_reward_bps // 10_000
    episodes = result["cheating"]["episodes"]
    for episode in episodes.values():
        assert episode["at_fault"] and episode["slashed_wei"] == cfg.slash_amount
        assert episode["bond_after_wei"] == episode["bond_before_wei"] - cfg.slash_amount
        assert episode["challenger_paid_wei"] == reward + cfg.challenger_bond
        assert episode["treasury_paid_wei"] == cfg.slash_amount - reward
        assert episode["resolve_gas"] > 0 and episode["challenge_gas"] > 0
        assert episode["referee_signatures"] == DEFAULT_THRESHOLD  # one from each referee process
        assert episode["quiet_audit_first_wrong"] == episode["first_wrong"]  # the re-timed audit agrees
        work = episode["referee_work"]  # each referee process re-executed the disputed step itself
        assert len(work) == DEFAULT_THRESHOLD and all(w["seconds"] > 0 for w in work)
        assert all(episode["first_wrong"] < w["target_positions"] < episode["audit_target_positions"] for w in work)
    stop = result["cheating"]["stop_early"]  # --cheat stop-early: every token right, the end early
    assert stop["early_end"] and stop["tokens"] == stop["max_tokens"] // 2 and stop["next_token"] is not None
    assert stop["at_fault"] and stop["bond_after_wei"] == stop["bond_before_wei"] - cfg.slash_amount
    spec, plain = episodes["with_speculation"], episodes["without_speculation"]
    assert spec["draft_tokens_accepted"] > 0 and plain["draft_tokens_accepted"] == 0  # the cheat did speculate
    assert spec["first_wrong"] == plain["first_wrong"] == min(result["setup"]["max_tokens"] // 2, FLIP_AT)
    assert spec["audit_target_positions"] == plain["audit_target_positions"]
    referee_positions = {m: [w["target_positions"] for w in e["referee_work"]] for m, e in episodes.items()}
    assert referee_positions["with_speculation"] == referee_positions["without_speculation"]
    # same storage state (credits withdrawn in between); calldata differs only in signature/address bytes
    assert abs(spec["resolve_gas"] - plain["resolve_gas"]) <= CALLDATA_GAS_SLACK
    assert abs(spec["challenge_gas"] - plain["challenge_gas"]) <= CALLDATA_GAS_SLACK
    audits = result["audits"]
    assert audits["with_speculation"]["all_correct"] and audits["without_speculation"]["all_correct"]
    assert audits["with_speculation"]["target_positions"] == audits["without_speculation"]["target_positions"]
    sizing = result["derived"]["bond_sizing"]
    assert sizing["with_speculation"]["min_bond_wei"] == sizing["without_speculation"]["min_bond_wei"]
    forgery = result["forgery"]
    assert forgery["textbook_freq"] > FORGED_FREQ and forgery["textbook_tv"] > FORGED_FREQ - forgery["target_prob"]
    assert forgery["gumbel_tv"] < forgery["noise_floor_tv"] + TV_NOISE_SLACK


def check_report(out, result: dict) -> None:
    """README.md and the PNGs are written, and the tables carry this run's numbers."""
    report = (out / "README.md").read_text()
    for png in ("with_without", "drafter_acceptance", "omega_convergence", "speedup_vs_gamma"):
        assert (out / f"{png}.png").stat().st_size > MIN_PNG_BYTES and f"({png}.png)" in report
    simulator = (out / "simulator.html").read_text()  # self-contained, this run's fit preselected
    assert "(simulator.html)" in report and '<script src="' not in simulator
    assert json.dumps(result["derived"]["fit"]["alpha"]) in simulator
    rows = result["derived"]["rows"]
    spec, plain = rows["with_speculation"], rows["without_speculation"]
    assert f"| target forward passes | {spec['target_passes']} | {plain['target_passes']} |" in report
    assert f"| target positions scored | {spec['target_positions']} | {plain['target_positions']} |" in report
    gas = result["cheating"]["episodes"]["with_speculation"]["challenge_gas"]
    assert f"| gas: challenge | {gas:,} |" in report
    work = result["cheating"]["episodes"]["without_speculation"]["referee_work"]
    shown = ", ".join(str(w["target_positions"]) for w in work)
    assert f"| referees' re-execution of the disputed step: positions (each referee) | {shown} | {shown} |" in report
    assert "--quick" in report and "(identical)" in report
    stopped = result["cheating"]["stop_early"]["tokens"]
    assert f"An operator that stops early (`--cheat stop-early`) answered {stopped} of" in report
    emitted = sum(r["accepted"] + 1 for r in result["with_speculation"]["rounds"])
    assert "## Draft rounds" in report and f"| all | {len(result['with_speculation']['rounds'])} |" in report
    assert f"| {emitted} |" in report
    assert result["memory"]["tree_pss_peak_gib"] > 0 and f"{result['memory']['tree_pss_peak_gib']} GiB" in report


def test_interrupted_demo_stops_every_process(tmp_path):
    """Ctrl-C while the targets are still starting: the demo exits and leaves nothing running."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "node", "demo-net", "--quick", "--out", str(tmp_path)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the chain is up; the target and drafter processes are being started
        if "SpecmarketBond at" in line:
            break
    time.sleep(INTERRUPT_AFTER_S)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(STOP_WAIT_S) == INTERRUPTED_EXIT
    time.sleep(1.0)
    leftovers = subprocess.run(["pgrep", "-f", "specmarket_demo_"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left running: {leftovers.stdout}"
    assert not (tmp_path / "demo_net.json").exists()
