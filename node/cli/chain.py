"""`specmarket chain up|deploy|status|down|fund|withdraw|unbond|withdraw-bond|refund|...`, `keys new|address`,
`challenge`, `referee`: arguments -> ChainConfig / DeployConfig / ChallengeConfig / RefereeConfig
(node/chain/admin.py).

Roles on a local anvil chain (chain id 31337) default to anvil's public dev accounts (deployer 0,
referees 1-3, challenger 5); anywhere else every key must come from a file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from pathlib import Path

from node.chain.config import ChainConfig, ChallengeConfig, DeployConfig, RefereeConfig
from node.chain.deployment import (
    DEFAULT_THAWING_PERIOD_S,
    DEFAULT_THRESHOLD,
    DEV_CHALLENGER,
    DEV_DEPLOYER,
    REDEEM_WINDOW_S,
    REFEREE_SET_MARGIN_S,
    BondConfig,
    format_ether,
    parse_ether,
)
from node.cli.options import add_pair_option, defaults

BOND_ETHER = {"min_bond": "min_bond", "challenger_bond": "challenger_bond", "slash": "slash_amount"}
BOND_SECONDS = ("challenge_window", "resolve_timeout", "unbonding_delay", "referee_set_delay")
STATUS_LIMIT = 50  # node.chain.challenges.DEFAULT_LIMIT (not imported: it loads web3)
FUND_ETHER = "1"  # `chain fund`'s default: gas for thousands of redemptions
VERDICTS = {True: "operator at fault", False: "operator cleared", None: "cannot judge (other model)"}


def _chain(args: argparse.Namespace) -> ChainConfig:
    """--rpc, --deployments and --state-dir where the command has them, else the defaults."""
    return ChainConfig(**{key: getattr(args, key, None) or value for key, value in defaults(ChainConfig).items()})


def _client(args: argparse.Namespace):
    from node.chain.admin import bond_client

    return bond_client(_chain(args))


def _deploy_config(args: argparse.Namespace) -> DeployConfig:
    given = {field: getattr(args, arg) for arg, field in BOND_ETHER.items() if getattr(args, arg) is not None}
    fields = {field: parse_ether(value) for field, value in given.items()}
    fields |= {name: getattr(args, name) for name in BOND_SECONDS if getattr(args, name) is not None}
    if args.reward_bps is not None:
        fields["challenger_reward_bps"] = args.reward_bps
    bond = dataclasses.replace(BondConfig(), **fields)
    delay = {"thawing_period": args.thawing_period} if args.thawing_period is not None else {}
    return DeployConfig(args.deployer_key, tuple(args.referee or ()), args.threshold, bond, **delay)


# ------------------------------------------------------------------------- chain commands


def _cmd_deploy(args: argparse.Namespace) -> int:
    from node.chain.admin import deploy_fresh

    deployment, path, gas = deploy_fresh(_chain(args), _deploy_config(args))
    print(
        f"deployed SpecmarketBond at {deployment.address} and DrafterEscrow at {deployment.escrow} on chain "
        f"{deployment.chain_id} (gas {gas} for both); wrote {path}"
    )
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    from node.chain.admin import ensure_deployed
    from node.chain.anvil import chain_id_at

    started, deployed = ensure_deployed(_chain(args), _deploy_config(args))
    state = "started" if started else "already up"
    done = (
        f"deployed SpecmarketBond at {deployed.address} and DrafterEscrow at {deployed.escrow}"
        if deployed
        else "deployment current"
    )
    print(f"chain {chain_id_at(args.rpc)} at {args.rpc}: {state}; {done}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from node.chain.anvil import stop_detached

    pid = stop_detached(_chain(args).state_dir, args.rpc)
    print(f"stopped anvil (pid {pid})" if pid else "no anvil started by `specmarket chain up` is running")
    return 0


def _cmd_fund(args: argparse.Namespace) -> int:
    from node.chain.admin import fund_from_dev_account

    wei = parse_ether(args.eth)
    sender, balance = fund_from_dev_account(args.rpc, args.address, wei)
    print(f"sent {format_ether(wei)} from anvil dev account 0 ({sender}) to {args.address}; its balance: "
          f"{format_ether(balance)}")  # fmt: skip
    return 0


def _cmd_keys_new(args: argparse.Namespace) -> int:
    from node.chain.keys import new_key_file

    print(new_key_file(args.out))  # the address only: the key stays in the file
    return 0


def _cmd_keys_address(args: argparse.Namespace) -> int:
    from node.chain.keys import key_address

    print(key_address(args.key_file))
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from node.chain.admin import chain_status, format_status

    status = chain_status(_chain(args), args.operator, args.limit)
    print(json.dumps(status, indent=2, default=str) if args.json else format_status(status))
    return 0


def _cmd_withdraw(args: argparse.Namespace) -> int:
    from node.chain.admin import role_key

    client = _client(args)
    tx = client.withdraw(role_key(args.key_file, client.domain.chain_id, args.dev_account, "account"))
    (event,) = client.decode_events(tx, "Withdrawn")
    print(f"withdrew {format_ether(event['amount'])} to {event['account']} (gas {tx.gas_used})")
    return 0


def _cmd_unbond(args: argparse.Namespace) -> int:
    from node.chain.keys import read_key

    client = _client(args)
    tx = client.send(read_key(args.key_file), "requestUnbond")
    (event,) = client.decode_events(tx, "UnbondRequested")
    print(f"operator {event['operator']} unbonding; `chain withdraw-bond` works from unix time {event['unbondAt']}")
    return 0


def _cmd_withdraw_bond(args: argparse.Namespace) -> int:
    from node.chain.keys import read_key

    client, key = _client(args), read_key(args.key_file)
    tx = client.send(key, "withdrawBond")  # releases the bond as a credit (pull payment) ...
    (event,) = client.decode_events(tx, "BondWithdrawn")
    (paid,) = client.decode_events(client.withdraw(key), "Withdrawn")  # ... which is then paid out
    bond, out = format_ether(event["amount"]), format_ether(paid["amount"])
    print(f"withdrew the bond of {event['operator']}: {bond}; paid out {out}")
    return 0


def _cmd_refund(args: argparse.Namespace) -> int:
    from node.chain.admin import role_key

    client = _client(args)
    key = role_key(args.key_file, client.domain.chain_id, DEV_CHALLENGER, "challenger")
    tx = client.send(key, "refundExpired", args.challenge_id)
    (event,) = client.decode_events(tx, "ChallengeExpired")
    print(f"challenge {args.challenge_id} expired: {format_ether(event['refunded'])} credited to {event['challenger']}")
    return 0


def _cmd_propose_referees(args: argparse.Namespace) -> int:
    from node.chain.admin import role_key

    client = _client(args)
    key = role_key(args.key_file, client.domain.chain_id, DEV_DEPLOYER, "owner")
    event = client.propose_referee_set(key, args.referee, args.threshold)
    print(
        f"proposed referee epoch {event['epoch']}: {len(event['members'])} referees, {event['threshold']} to decide; "
        f"anyone can activate it from unix time {event['eta']} (`specmarket chain activate-referees`)"
    )
    return 0


def _cmd_activate_referees(args: argparse.Namespace) -> int:
    from node.chain.admin import role_key

    client = _client(args)
    event = client.activate_referee_set(role_key(args.key_file, client.domain.chain_id, DEV_DEPLOYER, "sender"))
    print(f"referee epoch {event['epoch']} is active: {len(event['members'])} referees, {event['threshold']} to decide")
    return 0


def _cmd_cancel_referees(args: argparse.Namespace) -> int:
    from node.chain.admin import role_key

    client = _client(args)
    tx = client.send(role_key(args.key_file, client.domain.chain_id, DEV_DEPLOYER, "owner"), "cancelRefereeSet")
    (event,) = client.decode_events(tx, "RefereeSetCancelled")
    print(f"cancelled the proposed referee epoch {event['epoch']}")
    return 0


# ------------------------------------------------------------------------- challenge / referee


def _cmd_challenge(args: argparse.Namespace) -> int:
    from node.chain.admin import run_challenge

    d = defaults(ChallengeConfig)
    cfg = ChallengeConfig(
        args.receipt,
        args.key_file,
        args.target_model,
        args.position,
        args.wait,
        args.wait_s,
        pair=args.pair or d["pair"],
        force=args.force,
    )

    def opened(result: dict) -> None:  # at once, flushed: the id is what a challenger needs if the wait fails
        line = (
            f"challenge {result['challenge_id']} opened at position {result['position']} "
            f"(first token outside the band: {result['first_wrong']}; gas {result['gas_used']})"
        )
        if not args.json:
            print(line, flush=True)
        elif args.wait:
            print(f"{line}; waiting for the verdict", file=sys.stderr, flush=True)

    result = run_challenge(_chain(args), cfg, opened)
    if args.json:
        print(json.dumps(result))
    elif result["challenge_id"] is None:
        print(f"receipt is correct: all {result['tokens_checked']} tokens are within the tolerance band; nothing spent")
    elif "outcome" in result:
        print(f"outcome: {result['outcome']}")
    return 0


def _cmd_referee(args: argparse.Namespace) -> int:
    from node.chain.admin import open_referee
    from node.runtime.lifecycle import freeze_startup_heap

    d = defaults(RefereeConfig)
    cfg = RefereeConfig(
        tuple(args.key_file or ()), args.target_model, args.pool or d["pool"], args.poll_s, pair=args.pair or d["pair"]
    )
    referee = open_referee(_chain(args), cfg)
    freeze_startup_heap()

    def report(outcome) -> None:
        if args.json:
            print(f"outcome: {json.dumps(outcome.to_json())}", flush=True)
            return
        done = "resolved on chain" if outcome.resolved else f"{outcome.signatures} signature(s), no quorum yet"
        positions, seconds = outcome.target_positions, outcome.seconds
        cost = f" (re-executed {positions} target positions in {seconds:.3f} s)" if positions else ""
        print(f"challenge {outcome.challenge_id}: {VERDICTS[outcome.operator_at_fault]}; {done}{cost}", flush=True)

    if args.once:
        for outcome in referee.run_once():
            report(outcome)
        return 0
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"referee: {referee.client.address} on chain {referee.client.domain.chain_id} (Ctrl-C stops)", flush=True)
    referee.watch(stop, cfg.poll_s, on_outcome=report)
    return 0


# ------------------------------------------------------------------------- parsers


def _common(p: argparse.ArgumentParser) -> None:
    d = defaults(ChainConfig)
    p.add_argument("--rpc", default=d["rpc"], help=f"Ethereum JSON-RPC URL (default {d['rpc']})")
    p.add_argument(
        "--deployments",
        type=Path,
        default=d["deployments"],
        help=f"folder of <chainId>.json (default {d['deployments']})",
    )


# name -> (one-line help, --help description) of every `chain` subcommand
CHAIN_COMMANDS = {
    "up": (
        "start anvil (detached) if nothing answers, deploy both contracts if not deployed there",
        "Start anvil from npm (detached; its pid, log and state under --state-dir) if nothing answers at --rpc, "
        "and deploy SpecmarketBond and DrafterEscrow unless DEPLOYMENTS/<chainId>.json names contracts that are "
        "there. Prints the chain, whether it was started, and the addresses of what it deployed.",
    ),
    "deploy": (
        "deploy a new SpecmarketBond and DrafterEscrow (starting anvil if nothing answers)",
        "Always deploy a new SpecmarketBond (the operators' bond, receipts and challenges) and DrafterEscrow (the "
        "operators' deposits that pay drafters' vouchers), starting anvil if nothing answers at --rpc, and write "
        "DEPLOYMENTS/<chainId>.json. Off anvil every key must come from a file and the referees must be named.",
    ),
    "status": (
        "chain, contract, config, referees, operators, challenges, drafter escrows and payments",
        "Show the deployment at --rpc: its config, referee set, operators and their bonds, the newest challenges, "
        "and each operator's drafter escrow with what every drafter was paid and is owed.",
    ),
    "down": (
        "stop the anvil `chain up`/`chain deploy` started",
        "Stop the anvil that `chain up` or `chain deploy` started (by the pid it recorded in --state-dir); with "
        "--rpc, only if that anvil is the one serving it. A chain started otherwise is never stopped.",
    ),
    "fund": (
        "anvil only: send ETH to an address from anvil's dev account 0 (e.g. a drafter's payout address)",
        "Send --eth ETH to ADDRESS from anvil's public dev account 0 and print the address's new balance: gas "
        "for a drafter's payout key (`specmarket keys new`) to redeem its vouchers with. Refused on any chain "
        "but a local anvil (chain id 31337).",
    ),
    "withdraw": (
        "withdraw an account's credits (challenger rewards, refunds)",
        "Pay out an account's credits in SpecmarketBond (challenger bonds and rewards, refunds): every payout of "
        "the contract is a credit followed by this pull withdrawal.",
    ),
    "unbond": (
        "operator: request unbonding (the node stops being active)",
        "Operator: request unbonding. The node stops being active; `chain withdraw-bond` takes the bond back "
        "after the unbonding delay.",
    ),
    "withdraw-bond": (
        "operator: withdraw the bond after the unbonding delay",
        "Operator: withdraw the bond once the unbonding delay has passed and no challenge is open, and pay it out.",
    ),
    "refund": (
        "refund the challenger of a challenge the referees left unresolved",
        "Refund the challenger of a challenge left unresolved past the resolve timeout (credited, then paid out "
        "with `chain withdraw`).",
    ),
    "propose-referees": (
        "owner: propose the next referee set (it takes effect after the contract's referee-set delay)",
        "Owner: propose the next referee set and its threshold; anyone can activate it once the contract's "
        "referee-set delay has passed (`chain activate-referees`).",
    ),
    "activate-referees": (
        "anyone: activate a proposed referee set",
        "Anyone: activate the proposed referee set once its delay has passed.",
    ),
    "cancel-referees": (
        "owner: withdraw a proposed referee set",
        "Owner: withdraw the proposed referee set before it is activated.",
    ),
}


def _add_chain(sub) -> None:
    p = sub.add_parser(
        "chain",
        help="local chain: start anvil, deploy the bond and escrow contracts, show status, fund",
        description="Manage the local Anvil chain and the SpecmarketBond and DrafterEscrow deployment "
        "(DEPLOYMENTS/<chainId>.json). Each subcommand has its own --help.",
    )
    chain = p.add_subparsers(dest="chain_command", required=True)
    parsers = {
        name: chain.add_parser(name, help=help_, description=description)
        for name, (help_, description) in CHAIN_COMMANDS.items()
    }
    _chain_options(parsers)
    funcs = {
        "up": _cmd_up,
        "deploy": _cmd_deploy,
        "status": _cmd_status,
        "down": _cmd_down,
        "fund": _cmd_fund,
        "withdraw": _cmd_withdraw,
        "unbond": _cmd_unbond,
        "withdraw-bond": _cmd_withdraw_bond,
        "refund": _cmd_refund,
        "propose-referees": _cmd_propose_referees,
        "activate-referees": _cmd_activate_referees,
        "cancel-referees": _cmd_cancel_referees,
    }
    for name, q in parsers.items():
        q.set_defaults(func=funcs[name])


def _chain_options(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """Every `chain` subcommand's options (``parsers``: name -> its parser)."""
    up, deploy, status, down, fund = (parsers[n] for n in ("up", "deploy", "status", "down", "fund"))
    propose, activate, cancel = (parsers[n] for n in ("propose-referees", "activate-referees", "cancel-referees"))
    withdraw, refund, unbond, withdraw_bond = (parsers[n] for n in ("withdraw", "refund", "unbond", "withdraw-bond"))
    for q in (up, deploy, status, withdraw, unbond, withdraw_bond, refund, propose, activate, cancel):
        _common(q)
    d = defaults(ChainConfig)
    down.add_argument(
        "--rpc", help="stop the anvil only if it serves this URL (default: the one `chain up` started in --state-dir)"
    )
    fund.add_argument("address", help="the address to fund, 0x + 40 hex digits (`specmarket keys new` prints one)")
    fund.add_argument("--eth", default=FUND_ETHER, help=f"how much to send, in ETH (default {FUND_ETHER})")
    fund.add_argument("--rpc", default=d["rpc"], help=f"the anvil's JSON-RPC URL (default {d['rpc']})")
    propose.add_argument("--referee", action="append", required=True, help="referee address, repeatable")
    propose.add_argument("--threshold", type=int, required=True, help="verdict signatures needed, M of N")
    for q in (propose, activate, cancel):
        q.add_argument("--key-file", type=Path, help="sender key file (default on anvil: account 0, the owner)")
    for q in (unbond, withdraw_bond):
        q.add_argument("--key-file", type=Path, required=True, help="operator key file (DATA_DIR/keys/operator.key)")
    status.add_argument("--operator", help="only the challenges against this operator address")
    status.add_argument("--limit", type=int, default=STATUS_LIMIT, help=f"newest challenges shown ({STATUS_LIMIT})")
    status.add_argument("--json", action="store_true", help="print one JSON object (amounts as '0.1 ETH')")
    refund.add_argument("challenge_id", type=int, help="the challenge id (`specmarket chain status` lists them)")
    refund.add_argument("--key-file", type=Path, help="the sender's key file (default on anvil: dev account 5)")
    for q in (up, deploy, down):
        q.add_argument("--state-dir", type=Path, help=f"anvil's pid, log and state (default {d['state_dir']})")
    for q in (up, deploy):
        _deploy_options(q)
    withdraw.add_argument("--key-file", type=Path, help="the account's private key file")
    withdraw.add_argument("--dev-account", type=int, default=DEV_CHALLENGER, help="anvil dev account (default 5)")


def _add_keys(sub) -> None:
    p = sub.add_parser(
        "keys",
        help="make a private key file (e.g. a drafter's payout key) or show a key file's address",
        description="Private-key files: 32 bytes in hex, mode 0600, the form every --key-file reads. A key is "
        "never printed: these commands print addresses only.",
    )
    keys = p.add_subparsers(dest="keys_command", required=True)
    new = keys.add_parser(
        "new",
        help="write a fresh private key to a new file and print its address",
        description="Write a fresh random private key to --out (mode 0600; an existing file is never overwritten) "
        "and print only its address: give it to `specmarket drafter --payout`, fund it with `specmarket chain "
        "fund` on anvil, and redeem with `specmarket drafter redeem --key-file FILE`.",
    )
    new.add_argument("--out", type=Path, required=True, help="the new key file (refused if it exists)")
    new.set_defaults(func=_cmd_keys_new)
    address = keys.add_parser(
        "address", help="print a key file's address", description="Print the address of the key in --key-file."
    )
    address.add_argument("--key-file", type=Path, required=True, help="a private key file")
    address.set_defaults(func=_cmd_keys_address)


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
    p.add_argument(
        "--referee-set-delay",
        type=int,
        help=f"seconds before a proposed referee set takes effect; must exceed the unbonding delay "
        f"(default: the unbonding delay + {REFEREE_SET_MARGIN_S})",
    )
    p.add_argument(
        "--thawing-period",
        type=int,
        help="seconds between an operator's request to take funds back from a drafter's lane in the DrafterEscrow "
        f"(requestThaw) and the thaw; at least twice the {REDEEM_WINDOW_S} s drafters are told to redeem within "
        f"(default {DEFAULT_THAWING_PERIOD_S})",
    )


def _add_challenge(sub) -> None:
    d = defaults(ChallengeConfig)
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
    add_pair_option(p, d["pair"])
    p.add_argument("--target-model", type=Path, help="the committed target model (default: the pair's target)")
    p.add_argument(
        "--position",
        type=int,
        help="challenge this position instead; refused where the audit finds its token correct (certain to fail)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="with --position: submit even a challenge certain to fail (it loses the challenger bond)",
    )
    p.add_argument("--wait", action="store_true", help="wait for the verdict, then withdraw the challenger's credit")
    p.add_argument(
        "--wait-s", type=float, default=d["wait_s"], help=f"longest wait for the verdict (default {d['wait_s']})"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_challenge)


def _add_referee(sub) -> None:
    d = defaults(RefereeConfig)
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
    add_pair_option(p, d["pair"])
    p.add_argument("--target-model", type=Path, help="the committed target model (default: the pair's target)")
    p.add_argument("--pool", type=Path, help=f"verdict pool shared by referee processes (default {d['pool']})")
    p.add_argument(
        "--poll-s", type=float, default=d["poll_s"], help=f"seconds between looks at the chain ({d['poll_s']})"
    )
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
    _add_keys(sub)
    _add_challenge(sub)
    _add_referee(sub)
