"""`specmarket demo-net --quick`: anvil, deployment, bonded targets, four drafter peers, a slashed
cheating operator, all as real processes; every process is gone afterwards."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from node.chain.deployment import BondConfig

DEMO_TIMEOUT_S = 900
INTERRUPT_AFTER_S = 3.0  # into the targets' start-up (imports and model loading take longer)
STOP_WAIT_S = 60
INTERRUPTED_EXIT = 130  # what `specmarket` returns on KeyboardInterrupt


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
