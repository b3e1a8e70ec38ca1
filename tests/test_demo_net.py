"""`specmarket demo-net --quick`: anvil, deployment, bonded targets, four drafter peers, a slashed
cheating operator, all as real processes; every process is gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

from node.chain.deployment import BondConfig

DEMO_TIMEOUT_S = 900


def test_quick_networked_demo_end_to_end(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "node", "demo-net", "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "demo_net.json").read_text())
    spec, plain, cheat = result["with_speculation"], result["without_speculation"], result["cheating_episode"]
    assert result["identical_outputs"] and spec["output_hashes"] == plain["output_hashes"]
    assert spec["target_positions"] >= plain["target_positions"]  # the target still scores every token
    assert spec["draft_tokens_accepted"] > 0 and plain["draft_tokens_proposed"] == 0
    assert sum(result["drafter_credits"].values()) == spec["draft_tokens_accepted"]
    cfg = BondConfig()
    assert cheat["at_fault"] and cheat["slashed_wei"] == result["configured_slash_wei"] == cfg.slash_amount
    reward = cfg.slash_amount * cfg.challenger_reward_bps // 10_000
    assert cheat["challenger_paid_wei"] == reward + cfg.challenger_bond
    assert cheat["bond_after_wei"] == cheat["bond_before_wei"] - cfg.slash_amount
    leftovers = subprocess.run(["pgrep", "-f", "specmarket_demo_"], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left running: {leftovers.stdout}"
