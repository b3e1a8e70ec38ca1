"""`specmarket chain up|deploy|status|down|withdraw`, `specmarket challenge`, `specmarket referee`.

Roles on a local anvil chain (chain id 31337) default to anvil's public dev accounts (deployer 0,
referees 1-3, challenger 5); anywhere else every key must come from a file.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from pathlib import Path

from node.chain import ChainError
from node.chain.anvil import ANVIL_CHAIN_ID, DEFAULT_RPC, chain_id_at, ensure_anvil, stop_detached
from node.chain.deployment import (
    DEFAULT_DEPLOYMENTS_DIR,
    DEFAULT_THRESHOLD,
    DEV_CHALLENGER,
    DEV_DEPLOYER,
    DEV_REFEREES,
    BondConfig,
    Deployment,
    dev_address,
    dev_key,
    format_ether,
    parse_ether,
    require_dev_chain,
)
from node.chain.keys import read_key
from node.models import DEFAULT_TARGET
from node.runtime import default_data_dir, freeze_startup_heap

log = logging.getLogger("specmarket")


def _role_keys(files: list[Path] | None, chain_id: int, dev_indices: tuple[int, ...], role: str) -> list[bytes]:
    if files:
        return [read_key(f) for f in files]
    require_dev_chain(chain_id, f"{role} key")
    return [dev_key(i) for i in dev_indices]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rpc", default=DEFAULT_RPC, help=f"Ethereum JSON-RPC URL (default {DEFAULT_RPC})")
    p.add_argument(
        "--deployments", type=Path, default=DEFAULT_DEPLOYMENTS_DIR, help="folder of <chainId>.json deployment files"
    )


def _client(args: argparse.Namespace):
    from node.chain.client import BondClient, connect

    w3 = connect(args.rpc)
    return BondClient(w3, Deployment.load(args.deployments, int(w3.eth.chain_id)).address)


def _state_dir(args: argparse.Namespace) -> Path:
    return args.state_dir or default_data_dir("chain")


# ------------------------------------------------------------------------- chain up / deploy


def _bond_config(args: argparse.Namespace) -> BondConfig:
    base = BondConfig()
    ether = {"min_bond": args.min_bond, "challenger_bond": args.challenger_bond, "slash_amount": args.slash}
    seconds = {
        "challenge_window": args.challenge_window,
        "resolve_timeout": args.resolve_timeout,
        "unbonding_delay": args.unbonding_delay,
    }
    fields = {k: parse_ether(v) for k, v in ether.items() if v is not None}
    fields |= {k: int(v) for k, v in seconds.items() if v is not None}
    if args.reward_bps is not None:
        fields["challenger_reward_bps"] = args.reward_bps
    return BondConfig(**{**base.__dict__, **fields})


def deploy_fresh(args: argparse.Namespace) -> Deployment:
    """Start anvil if nothing answers at --rpc, deploy SpecmarketBond, write deployments/<chainId>.json."""
    from node.chain.client import connect, deploy

    ensure_anvil(args.rpc, _state_dir(args))
    w3 = connect(args.rpc)
    chain_id = int(w3.eth.chain_id)
    (deployer,) = _role_keys([args.deployer_key] if args.deployer_key else None, chain_id, (DEV_DEPLOYER,), "deployer")
    referees = args.referee or ([dev_address(i) for i in DEV_REFEREES] if chain_id == ANVIL_CHAIN_ID else [])
    if not referees:
        raise ChainError("off a dev chain, name the referees with --referee ADDRESS (repeatable)")
    threshold = args.threshold if args.threshold is not None else min(DEFAULT_THRESHOLD, len(referees))
    deployment, tx = deploy(w3, deployer, _bond_config(args), referees, threshold)
    path = deployment.save(args.deployments)
    print(f"deployed SpecmarketBond at {deployment.address} on chain {chain_id} (gas {tx.gas_used}); wrote {path}")
    return deployment


def _cmd_deploy(args: argparse.Namespace) -> int:
    deploy_fresh(args)
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    started = ensure_anvil(args.rpc, _state_dir(args))
    chain_id = chain_id_at(args.rpc)
    try:
        _client(args)
        print(f"chain {chain_id} at {args.rpc}: {'started' if started else 'already up'}; deployment current")
    except ChainError as exc:  # no deployment file, or its contract is not on this chain (a fresh anvil)
        log.info("deploying: %s", exc)
        deploy_fresh(args)
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    pid = stop_detached(_state_dir(args))
    print(f"stopped anvil (pid {pid})" if pid else "no anvil started by `specmarket chain up` is running")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from node.chain.client import connect

    chain_id = chain_id_at(args.rpc)
    if chain_id is None:
        raise ChainError(f"nothing answers at {args.rpc}: run `specmarket chain up`")
    client = _client(args)
    cfg = client.config()
    registered = client.events("OperatorRegistered")
    status = {
        "rpc": args.rpc,
        "chain_id": chain_id,
        "block": connect(args.rpc).eth.block_number,
        "contract": client.address,
        "config": {
            **cfg.__dict__,
            "min_bond": format_ether(cfg.min_bond),
            "slash_amount": format_ether(cfg.slash_amount),
        },
        "referees": client.referees(),
        "threshold": client.threshold(),
        "operators": {e["operator"]: _operator_row(client, e["operator"]) for e in registered},
        "challenges": len(client.events("ChallengeOpened")),
    }
    print(json.dumps(status, indent=2, default=str))
    return 0


def _operator_row(client, address: str) -> dict:
    info = client.operator_info(address)
    return {"active": info.active, "bond": format_ether(info.bond), "open_challenges": info.open_challenges}


def _cmd_withdraw(args: argparse.Namespace) -> int:
    client = _client(args)
    (key,) = _role_keys([args.key_file] if args.key_file else None, client.domain.chain_id, (args.dev_account,), "")
    tx = client.withdraw(key)
    (event,) = client.decode_events(tx, "Withdrawn")
    print(f"withdrew {format_ether(event['amount'])} to {event['account']} (gas {tx.gas_used})")
    return 0


def _cmd_unbond(args: argparse.Namespace) -> int:
    client = _client(args)
    tx = client.send(read_key(args.key_file), "requestUnbond")
    (event,) = client.decode_events(tx, "UnbondRequested")
    print(f"operator {event['operator']} unbonding; `chain withdraw-bond` works from unix time {event['unbondAt']}")
    return 0


def _cmd_withdraw_bond(args: argparse.Namespace) -> int:
    client, key = _client(args), read_key(args.key_file)
    tx = client.send(key, "withdrawBond")  # releases the bond as a credit (pull payment) ...
    (event,) = client.decode_events(tx, "BondWithdrawn")
    (paid,) = client.decode_events(client.withdraw(key), "Withdrawn")  # ... which is then paid out
    bond, out = format_ether(event["amount"]), format_ether(paid["amount"])
    print(f"withdrew the bond of {event['operator']}: {bond}; paid out {out}")
    return 0


def _cmd_refund(args: argparse.Namespace) -> int:
    client = _client(args)
    (key,) = _role_keys([args.key_file] if args.key_file else None, client.domain.chain_id, (DEV_CHALLENGER,), "")
    tx = client.send(key, "refundExpired", args.challenge_id)
    (event,) = client.decode_events(tx, "ChallengeExpired")
    print(f"challenge {args.challenge_id} expired: {format_ether(event['refunded'])} credited to {event['challenger']}")
    return 0


# ------------------------------------------------------------------------- challenge / referee


def _cmd_challenge(args: argparse.Namespace) -> int:
    from node.chain.challenger import challenge_receipt, read_receipt_file, wait_for_outcome
    from node.models import load_model_dir, model_hash

    signed = read_receipt_file(args.receipt)
    client = _client(args)
    (key,) = _role_keys([args.key_file] if args.key_file else None, client.domain.chain_id, (DEV_CHALLENGER,), "")
    model, _ = load_model_dir(args.target_model, "target")
    report = challenge_receipt(client, key, model, model_hash(args.target_model), signed, force_position=args.position)
    result = report.to_json()
    if report.challenge_id is not None and args.wait:
        result["outcome"] = wait_for_outcome(client, key, report.challenge_id, args.wait_s)
    if args.json:
        print(json.dumps(result))
    elif report.challenge_id is None:
        print(f"receipt is correct: all {result['tokens_checked']} tokens are within the tolerance band; nothing spent")
    else:
        print(
            f"challenge {report.challenge_id} opened at position {report.position} "
            f"(first token outside the band: {report.audit.first_wrong}; gas {report.gas_used})"
        )
        if "outcome" in result:
            print(f"outcome: {result['outcome']}")
    return 0


def _cmd_referee(args: argparse.Namespace) -> int:
    from node.chain.referee import Referee
    from node.models import load_model_dir, model_hash

    client = _client(args)
    keys = _role_keys(args.key_file, client.domain.chain_id, DEV_REFEREES, "referee")
    model, tokenizer = load_model_dir(args.target_model, "target")
    model.fork().extend([tokenizer.eos_token_id])  # warm up: the first forward pass is slow, not a verdict's cost
    pool = args.pool or default_data_dir("referee") / "verdicts"
    referee = Referee(client, keys, model, model_hash(args.target_model), pool)
    freeze_startup_heap()

    def report(outcome) -> None:
        if args.json:
            print(f"outcome: {json.dumps(outcome.to_json())}", flush=True)
            return
        verdict = {True: "operator at fault", False: "operator cleared", None: "cannot judge (other model)"}
        done = "resolved on chain" if outcome.resolved else f"{outcome.signatures} signature(s), no quorum yet"
        positions, seconds = outcome.target_positions, outcome.seconds
        cost = f" (re-executed {positions} target positions in {seconds:.3f} s)" if positions else ""
        print(f"challenge {outcome.challenge_id}: {verdict[outcome.operator_at_fault]}; {done}{cost}", flush=True)

    if args.once:
        for outcome in referee.run_once():
            report(outcome)
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"referee: {client.address} on chain {client.domain.chain_id} (Ctrl-C stops)", flush=True)
    referee.watch(stop, args.poll_s, on_outcome=report)
    return 0


# ------------------------------------------------------------------------- parsers


def _add_chain(sub) -> None:
    p = sub.add_parser(
        "chain",
        help="local chain: start anvil, deploy the bond contract, show status",
        description="Manage the local Anvil chain and the SpecmarketBond deployment (deployments/<chainId>.json).",
    )
    chain = p.add_subparsers(dest="chain_command", required=True)
    up = chain.add_parser("up", help="start anvil (detached) if nothing answers, deploy if not deployed there")
    deploy = chain.add_parser("deploy", help="deploy a new SpecmarketBond (starting anvil if nothing answers)")
    status = chain.add_parser("status", help="chain, contract, config, referees, operators, challenges")
    down = chain.add_parser("down", help="stop the anvil `chain up`/`chain deploy` started")
    withdraw = chain.add_parser("withdraw", help="withdraw an account's credits (challenger rewards, refunds)")
    unbond = chain.add_parser("unbond", help="operator: request unbonding (the node stops being active)")
    withdraw_bond = chain.add_parser("withdraw-bond", help="operator: withdraw the bond after the unbonding delay")
    refund = chain.add_parser("refund", help="refund the challenger of a challenge the referees left unresolved")
    for q in (up, deploy, status, withdraw, unbond, withdraw_bond, refund):
        _common(q)
    for q in (unbond, withdraw_bond):
        q.add_argument("--key-file", type=Path, required=True, help="operator key file (DATA_DIR/keys/operator.key)")
    refund.add_argument("challenge_id", type=int, help="the challenge id")
    refund.add_argument("--key-file", type=Path, help="the sender's key file (default on anvil: dev account 5)")
    unbond.set_defaults(func=_cmd_unbond)
    withdraw_bond.set_defaults(func=_cmd_withdraw_bond)
    refund.set_defaults(func=_cmd_refund)
    for q in (up, deploy, down):
        q.add_argument(
            "--state-dir", type=Path, help="anvil's pid, log and state (default ~/.local/share/specmarket/chain)"
        )
    for q in (up, deploy):
        _deploy_options(q)
    withdraw.add_argument("--key-file", type=Path, help="the account's private key file")
    withdraw.add_argument("--dev-account", type=int, default=DEV_CHALLENGER, help="anvil dev account (default 5)")
    up.set_defaults(func=_cmd_up)
    deploy.set_defaults(func=_cmd_deploy)
    status.set_defaults(func=_cmd_status)
    down.set_defaults(func=_cmd_down)
    withdraw.set_defaults(func=_cmd_withdraw)


def _deploy_options(p: argparse.ArgumentParser) -> None:
    d = BondConfig()
    p.add_argument("--deployer-key", type=Path, help="deployer (and owner) key file (default: anvil account 0)")
    p.add_argument("--referee", action="append", help="referee address, repeatable (default: anvil accounts 1-3)")
    p.add_argument("--threshold", type=int, help=f"verdict signatures needed, M of N (default {DEFAULT_THRESHOLD})")
    p.add_argument("--min-bond", help=f"least operator bond in ETH (default {format_ether(d.min_bond)})")
    p.add_argument("--slash", help=f"slash per proven fault in ETH (default {format_ether(d.slash_amount)})")
    p.add_argument("--challenger-bond", help=f"challenger bond in ETH (default {format_ether(d.challenger_bond)})")
    p.add_argument("--reward-bps", type=int, help=f"challenger's share of a slash (default {d.challenger_reward_bps})")
    p.add_argument("--challenge-window", type=int, help=f"seconds (default {d.challenge_window})")
    p.add_argument("--resolve-timeout", type=int, help=f"seconds (default {d.resolve_timeout})")
    p.add_argument("--unbonding-delay", type=int, help=f"seconds (default {d.unbonding_delay})")


def _add_challenge(sub) -> None:
    p = sub.add_parser(
        "challenge",
        help="audit a receipted answer and challenge it on chain if a token is wrong",
        description=(
            "Re-execute the receipt's request with the target model (plain decoding, teacher-forced on the "
            "answer) and find the first token outside the numeric tolerance band. A correct answer spends "
            "nothing; a wrong one is challenged at that position, posting the challenger bond."
        ),
    )
    _common(p)
    p.add_argument("--receipt", type=Path, required=True, help="receipt file (`specmarket ask --receipt-out`)")
    p.add_argument("--key-file", type=Path, help="challenger key file (default on anvil: dev account 5)")
    p.add_argument("--target-model", type=Path, default=DEFAULT_TARGET, help="the committed target model directory")
    p.add_argument("--position", type=int, help="challenge this position whatever the audit says (a false challenge)")
    p.add_argument("--wait", action="store_true", help="wait for the verdict, then withdraw the challenger's credit")
    p.add_argument("--wait-s", type=float, default=600.0, help="longest wait for the verdict (default 600)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_challenge)


def _add_referee(sub) -> None:
    p = sub.add_parser(
        "referee",
        help="judge wrong-token challenges: re-execute the disputed step, sign and submit verdicts",
        description=(
            "Watch the bond contract for challenges, re-execute the single disputed step with the target model, "
            "sign an EIP-712 verdict with each referee key, and resolve once a quorum of signatures is in the "
            "shared verdict pool."
        ),
    )
    _common(p)
    p.add_argument("--key-file", type=Path, action="append", help="referee key file, repeatable (default: anvil 1-3)")
    p.add_argument("--target-model", type=Path, default=DEFAULT_TARGET, help="the committed target model directory")
    p.add_argument("--pool", type=Path, help="verdict pool shared by referee processes (default in the data dir)")
    p.add_argument("--poll-s", type=float, default=1.0, help="seconds between looks at the chain (default 1)")
    p.add_argument("--once", action="store_true", help="handle the challenges open now, then exit")
    p.add_argument(
        "--json",
        action="store_true",
        help="print each outcome as one line 'outcome: {...}' (challenge_id, operator_at_fault, signatures, "
        "resolved, gas_used, target_positions and seconds of the re-executed step)",
    )
    p.set_defaults(func=_cmd_referee)


def add_chain_commands(sub) -> None:
    _add_chain(sub)
    _add_challenge(sub)
    _add_referee(sub)
