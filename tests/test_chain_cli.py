"""`scripts/deploy.py` / `specmarket chain up|status|down` against anvil started from npm."""

from __future__ import annotations

import json
import subprocess
import sys

from chainutil import free_port

from node.chain.anvil import chain_id_at

TIMEOUT_S = 180


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=TIMEOUT_S)


def test_deploy_script_starts_anvil_deploys_and_chain_down_stops_it(tmp_path):
    rpc = f"http://127.0.0.1:{free_port()}"
    where = ["--rpc", rpc, "--deployments", str(tmp_path / "dep")]
    state = ["--state-dir", str(tmp_path / "chain")]
    assert chain_id_at(rpc) is None
    try:
        deployed = run("scripts/deploy.py", *where, *state, "--slash", "0.5", "--threshold", "3")
        assert deployed.returncode == 0, deployed.stderr
        record = json.loads((tmp_path / "dep" / "31337.json").read_text())
        assert record["config"]["slash_amount"] == 5 * 10**17 and record["threshold"] == 3
        status = run("-m", "node", "chain", "status", "--json", *where)
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert shown["contract"] == record["address"] and shown["threshold"] == 3 and len(shown["referees"]) == 3
        assert shown["config"]["slash_amount"] == "0.5 ETH" and shown["config"]["challenger_bond"] == "0.1 ETH"
        assert shown["challenge_count"] == 0 and shown["challenges"] == []
        up = run("-m", "node", "chain", "up", *where, *state)
        assert up.returncode == 0 and "deployment current" in up.stdout
    finally:
        down = run("-m", "node", "chain", "down", *state)
    assert down.returncode == 0 and "stopped anvil" in down.stdout
    assert chain_id_at(rpc) is None


def test_chain_commands_fail_clearly_without_a_chain_or_deployment(tmp_path):
    rpc = f"http://127.0.0.1:{free_port()}"
    status = run("-m", "node", "chain", "status", "--rpc", rpc)
    assert status.returncode == 2 and "nothing answers" in status.stderr
    remote = run("-m", "node", "chain", "deploy", "--rpc", "http://192.0.2.1:8545", "--state-dir", str(tmp_path))
    assert remote.returncode == 2 and "only http://127.0.0.1:PORT can be started" in remote.stderr
    target = run(
        "-m",
        "node",
        "target",
        "--pair",
        "tiny",
        "--chain",
        rpc,
        "--data-dir",
        str(tmp_path / "t"),
        "--http",
        "127.0.0.1:0",
    )
    assert target.returncode == 2 and f"no Ethereum JSON-RPC endpoint answers at {rpc}" in target.stderr
    cheat = run("-m", "node", "target", "--pair", "tiny", "--cheat", "flip-token", "--data-dir", str(tmp_path / "t"))
    assert cheat.returncode == 2 and "--cheat only makes sense for a bonded node" in cheat.stderr
    receipt = tmp_path / "r.json"
    receipt.write_text("{not json")
    bad = run("scripts/challenge.py", "--receipt", str(receipt), "--rpc", rpc)
    assert bad.returncode == 2 and "cannot read receipt file" in bad.stderr
