"""`specmarket demo-net`: the thesis end to end on one machine, every party its own process.

1. an anvil chain (from npm) with SpecmarketBond deployed;
2. a bonded target node with four drafter peers over libp2p (two honest, two hostile), and a
   second bonded target that does not speculate; the same prompts go to both through the
   OpenAI-compatible API: speculation changes the target passes, not the answers;
3. a cheating operator (`--cheat flip-token`): its answer is audited, challenged on chain,
   resolved by a referee process (a quorum of referee keys), and the operator is slashed.

Every process it starts is stopped when it ends, on an error or Ctrl-C/SIGTERM too.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tqdm import tqdm

from node.procs import STARTUP_TIMEOUT_S, ProcessGroup, sigterm_unwinds, spawn, start_drafter, start_target

log = logging.getLogger(__name__)

DEMO_PROMPTS = (
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        ",
    "    for i in range(len(",
    "def parse_args(argv):\n    parser = argparse.",
)
DEMO_DRAFTERS = ("honest", "honest", "lying", "garbage")  # two honest peers, two hostile ones
DEMO_TEMPERATURE = 0.8
CHEAT = "flip-token"
VERDICT_TIMEOUT_S = 120.0
HTTP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class NetDemoConfig:
    out: Path = Path("demo_out")
    max_tokens: int = 48
    prompts: tuple[str, ...] = DEMO_PROMPTS
    quick: bool = False  # CI: fewer prompts and tokens, same steps


def step(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _complete(http: str, prompt: str, seed: int, max_tokens: int) -> dict:
    body = {"prompt": prompt, "seed": seed, "max_tokens": max_tokens, "temperature": DEMO_TEMPERATURE}
    req = urllib.request.Request(
        f"{http}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def _wait_drafters(http: str, n: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{http}/health", timeout=10) as resp:
            if len(json.loads(resp.read()).get("drafters", {})) >= n:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the target did not see {n} drafters within {timeout_s:.0f} s")


def _ask_all(http: str, cfg: NetDemoConfig, label: str) -> list[dict]:
    return [
        _complete(http, prompt, seed, cfg.max_tokens)
        for seed, prompt in enumerate(tqdm(cfg.prompts, desc=label, unit="prompt", file=sys.stderr))
    ]


def _mode_row(answers: list[dict]) -> dict:
    stats = [a["specmarket"]["stats"] for a in answers]
    tokens = sum(len(a["specmarket"]["tokens"]) for a in answers)
    wall = sum(s["wall_seconds"] for s in stats)
    proposed = sum(s["draft_tokens_proposed"] for s in stats)
    return {
        "tokens": tokens,
        "wall_seconds": round(wall, 3),
        "tokens_per_second": round(tokens / wall, 2) if wall else 0.0,
        "target_passes": sum(s["target_passes"] for s in stats),
        "target_positions": sum(s["target_positions"] for s in stats),
        "draft_tokens_proposed": proposed,
        "draft_tokens_accepted": sum(s["draft_tokens_accepted"] for s in stats),
        "output_hashes": [a["specmarket"]["receipt"]["receipt"]["output_hash"] for a in answers],
    }


def _serve_and_compare(group: ProcessGroup, work: Path, chain_args: list[str], cfg: NetDemoConfig) -> dict:
    spec, plain = group.start_all(
        [
            partial(start_target, work, *chain_args, "--max-drafters", "4", name="target-spec"),
            partial(start_target, work, *chain_args, "--max-drafters", "0", name="target-plain"),
        ]
    )
    bootstrap = spec.lines["multiaddr"][0]
    group.start_all(
        [
            partial(start_drafter, work, bootstrap, strategy, f"drafter{i}-{strategy}", "--seed", str(i))
            for i, strategy in enumerate(DEMO_DRAFTERS)
        ]
    )
    _wait_drafters(spec.lines["http"][0], len(DEMO_DRAFTERS))
    step(f"bonded targets up; {len(DEMO_DRAFTERS)} drafter peers ({', '.join(DEMO_DRAFTERS)}) registered")
    with_spec = _ask_all(spec.lines["http"][0], cfg, "with speculation")
    without = _ask_all(plain.lines["http"][0], cfg, "without speculation")
    credits: dict[str, int] = {}
    for a in with_spec:
        for peer, n in a["specmarket"]["credits"].items():
            credits[peer] = credits.get(peer, 0) + n
    identical = [a["specmarket"]["tokens"] for a in with_spec] == [a["specmarket"]["tokens"] for a in without]
    return {
        "with_speculation": _mode_row(with_spec),
        "without_speculation": _mode_row(without),
        "identical_outputs": identical,
        "drafter_credits": credits,
        "receipts": [a["specmarket"]["receipt"] for a in with_spec],
    }


def _cheating_episode(group: ProcessGroup, work: Path, chain_args: list[str], client, cfg: NetDemoConfig) -> dict:
    from node.chain.challenger import challenge_receipt
    from node.chain.client import ChallengeStatus
    from node.chain.deployment import DEV_CHALLENGER, dev_address, dev_key
    from node.chain.receipts import SignedReceipt
    from node.models import DEFAULT_TARGET, load_model_dir, model_hash

    referee_args = ["referee", *chain_args_for_cli(chain_args), "--pool", str(work / "verdicts")]
    cheat, _ = group.start_all(
        [
            partial(start_target, work, *chain_args, "--max-drafters", "0", "--cheat", CHEAT, name="target-cheat"),
            partial(spawn, referee_args, work / "referee.log", ("referee",), STARTUP_TIMEOUT_S),
        ]
    )
    answer = _complete(cheat.lines["http"][0], cfg.prompts[0], 0, cfg.max_tokens)
    signed = SignedReceipt.from_json(answer["specmarket"]["receipt"])
    operator = signed.receipt.operator
    bond_before = client.operator_info(operator).bond
    model, _ = load_model_dir(DEFAULT_TARGET, "target")
    report = challenge_receipt(client, dev_key(DEV_CHALLENGER), model, model_hash(DEFAULT_TARGET), signed)
    cid = report.challenge_id
    step(f"cheating operator {operator}: first wrong token at {report.audit.first_wrong}; challenge {cid} opened")
    status = client.wait_closed(cid, VERDICT_TIMEOUT_S)  # the referee process resolves it
    (resolved,) = [e for e in client.events("ChallengeResolved") if e["id"] == report.challenge_id] or [{}]
    credited = client.credits(dev_address(DEV_CHALLENGER))
    paid = client.decode_events(client.withdraw(dev_key(DEV_CHALLENGER)), "Withdrawn")[0] if credited else {}
    return {
        "operator": operator,
        "first_wrong": report.audit.first_wrong,
        "challenge_id": report.challenge_id,
        "challenge_gas": report.gas_used,
        "audit_target_positions": report.audit.target_positions,
        "audit_seconds": round(report.audit.seconds, 4),
        "at_fault": status is ChallengeStatus.OPERATOR_AT_FAULT,
        "slashed_wei": int(resolved.get("slashed", 0)),
        "bond_before_wei": bond_before,
        "bond_after_wei": client.operator_info(operator).bond,
        "challenger_paid_wei": int(paid.get("amount", 0)),
    }


def chain_args_for_cli(chain_args: list[str]) -> list[str]:
    """--chain URL --deployments DIR (target flags) -> --rpc URL --deployments DIR (chain commands)."""
    return ["--rpc" if a == "--chain" else a for a in chain_args]


def _print_summary(result: dict) -> None:
    spec, plain, cheat = result["with_speculation"], result["without_speculation"], result["cheating_episode"]
    print(f"{'':<22}{'tok/s':>8}{'target passes':>15}{'positions':>11}{'drafts accepted':>17}")
    for name, row in (("with speculation", spec), ("without speculation", plain)):
        accepted = f"{row['draft_tokens_accepted']}/{row['draft_tokens_proposed']}"
        print(
            f"{name:<22}{row['tokens_per_second']:>8}{row['target_passes']:>15}{row['target_positions']:>11}"
            f"{accepted:>17}"
        )
    print(f"identical outputs (and output hashes) with and without speculation: {result['identical_outputs']}")
    print(f"accepted-token credits per drafter peer: {result['drafter_credits']}")
    eth = 10**18
    print(
        f"cheating operator ({CHEAT}): challenged at token {cheat['first_wrong']}, at fault: {cheat['at_fault']}, "
        f"slashed {cheat['slashed_wei'] / eth} ETH (bond {cheat['bond_before_wei'] / eth} -> "
        f"{cheat['bond_after_wei'] / eth}), challenger paid {cheat['challenger_paid_wei'] / eth} ETH"
    )


def run_demo_net(cfg: NetDemoConfig) -> int:
    from node.chain.anvil import AnvilProcess, free_port
    from node.chain.client import BondClient, connect, deploy
    from node.chain.deployment import DEFAULT_THRESHOLD, DEV_DEPLOYER, DEV_REFEREES, BondConfig, dev_address, dev_key

    if cfg.quick:
        cfg = NetDemoConfig(cfg.out, min(cfg.max_tokens, 16), cfg.prompts[:2], True)
    with (
        sigterm_unwinds(),
        tempfile.TemporaryDirectory(prefix="specmarket_demo_") as tmp,
        ProcessGroup() as group,
        AnvilProcess(free_port()) as anvil,
    ):
        work = Path(tmp)
        w3 = connect(anvil.url)
        config = BondConfig()
        referees = [dev_address(i) for i in DEV_REFEREES]
        deployment, tx = deploy(w3, dev_key(DEV_DEPLOYER), config, referees, DEFAULT_THRESHOLD)
        deployment.save(work / "deployments")
        client = BondClient(w3, deployment.address)
        step(f"anvil at {anvil.url}; SpecmarketBond at {deployment.address} (gas {tx.gas_used})")
        chain_args = ["--chain", anvil.url, "--deployments", str(work / "deployments")]
        result = _serve_and_compare(group, work, chain_args, cfg)
        step("cheating-operator episode")
        result["cheating_episode"] = _cheating_episode(group, work, chain_args, client, cfg)
        result["configured_slash_wei"] = config.slash_amount
        step("stopping every process")
    _print_summary(result)
    cfg.out.mkdir(parents=True, exist_ok=True)
    (cfg.out / "demo_net.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {cfg.out / 'demo_net.json'}")
    cheat = result["cheating_episode"]
    ok = result["identical_outputs"] and cheat["at_fault"] and cheat["slashed_wei"] == config.slash_amount
    return 0 if ok else 1
