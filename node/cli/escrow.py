"""`specmarket escrow status|deposit|withdraw|fund-lane|request-thaw|cancel-thaw|thaw`: an operator's
DrafterEscrow by hand (contracts/src/DrafterEscrow.sol states the rules).

A bonded target funds its drafters' lanes by itself (``node.target.paymaster``); these commands are
for the operator's own money: what its pool and lanes hold, taking pool funds back at once, and a
lane's funds back after the thawing period. Every command but ``status`` signs with the operator's
key file (DATA_DIR/keys/operator.key); no key is ever printed.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from node.chain import ChainError
from node.chain.config import ChainConfig
from node.chain.deployment import format_ether, parse_ether
from node.cli.options import defaults

MAX_LANE_ID = 2**64 - 1  # lanes are uint64 on chain

# name -> (one-line help, --help description)
ESCROW_COMMANDS = {
    "status": (
        "an operator's pool and lanes: what each holds, paid, owes, and a pending thaw",
        "Show one operator's DrafterEscrow pool (promised to nobody) and every lane it funded: what the lane "
        "holds, has paid and still owes its drafter, and a pending thaw with the time it may be taken.",
    ),
    "deposit": (
        "add ETH to the operator's pool",
        "Deposit ETH into the operator's pool. A bonded target moves pool funds into its drafters' lanes "
        "as it needs them (--lane-deposit).",
    ),
    "withdraw": (
        "take ETH back from the pool, at once",
        "Take ETH back from the operator's pool at once: the pool is promised to no drafter. Funds in a "
        "lane come back only through request-thaw and thaw.",
    ),
    "fund-lane": (
        "move ETH into a drafter's lane (from the pool, or sent along)",
        "Move ETH into the lane (operator, DRAFTER, --lane): from the pool (--eth), plus ETH sent with the "
        "transaction (--send-eth). Only that drafter's vouchers of that lane are paid from it.",
    ),
    "request-thaw": (
        "ask a lane's funds back; they return after the thawing period",
        "Ask for a lane's funds back into the pool. They can be taken (thaw) once the escrow's thawing "
        "period has passed; vouchers the drafter redeems before then are still paid first.",
    ),
    "cancel-thaw": ("cancel a lane's pending thaw", "Cancel a lane's pending thaw: its funds stay in the lane."),
    "thaw": (
        "take a thawed lane's funds back into the pool",
        "Once the thawing period has passed, move what the lane still holds of the thaw back into the pool "
        "(then `escrow withdraw` takes it out).",
    ),
}


def _lane_id(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a lane id: {text!r}") from None
    if not 0 <= value <= MAX_LANE_ID:
        raise argparse.ArgumentTypeError(f"a lane id is 0 .. 2^64-1, got {value}")
    return value


def _escrow(args: argparse.Namespace):
    """The DrafterEscrow recorded beside the bond for the chain at --rpc."""
    from node.chain.contract import connect
    from node.chain.deployment import Deployment
    from node.chain.escrow import EscrowClient

    w3 = connect(args.rpc)
    chain_id = int(w3.eth.chain_id)
    deployment = Deployment.load(args.deployments, chain_id)
    if not deployment.escrow:
        raise ChainError(f"no DrafterEscrow is recorded for chain {chain_id} in {args.deployments}")
    return EscrowClient(w3, deployment.escrow)


def _key(args: argparse.Namespace) -> tuple[bytes, str]:
    from eth_account import Account

    from node.chain.keys import read_key

    key = read_key(args.key_file)
    return key, Account.from_key(key).address


def _operator(args: argparse.Namespace) -> str:
    if args.operator:
        return args.operator
    if args.key_file:
        return _key(args)[1]
    raise ChainError("name the operator: --operator ADDRESS, or --key-file with its key")


def _cmd_status(args: argparse.Namespace) -> int:
    escrow = _escrow(args)
    status = operator_status(escrow, _operator(args))
    print(json.dumps(status, indent=2) if args.json else "\n".join(status_lines(status)))
    return 0


def operator_status(escrow, operator: str) -> dict:
    """JSON-ready: the operator's pool and every lane it funded, amounts in wei."""
    from eth_utils import to_checksum_address

    operator = to_checksum_address(operator)
    lanes = escrow.funded_lanes(operator)
    rows = [{"drafter": dr, "lane": lane_id, **vars(state)} for _, dr, lane_id, state in lanes]
    now = int(escrow.w3.eth.get_block("latest")["timestamp"])
    return {
        "escrow": escrow.address,
        "operator": operator,
        "thawing_period": escrow.thawing_period(),
        "chain_time": now,
        "pool": escrow.pool(operator),
        "lanes": rows,
    }


def status_lines(status: dict) -> list[str]:
    lines = [
        f"escrow {status['escrow']} (thawing period {status['thawing_period']} s)",
        f"operator {status['operator']}: pool {format_ether(status['pool'])}, {len(status['lanes'])} lane(s)",
    ]
    for row in status["lanes"]:
        thaw = ""
        if row["thaw_ready_at"]:
            wait = row["thaw_ready_at"] - status["chain_time"]
            when = "ready now" if wait <= 0 else f"ready in {wait} s"
            thaw = f", thawing {format_ether(row['thawing'])} ({when})"
        lines.append(
            f"  {row['drafter']} lane {row['lane']}: holds {format_ether(row['balance'])}{thaw}, "
            f"paid {format_ether(row['paid'])}, owed {format_ether(row['owed'])}"
        )
    return lines


def _cmd_deposit(args: argparse.Namespace) -> int:
    escrow, (key, operator) = _escrow(args), _key(args)
    amount = parse_ether(args.eth)
    tx = escrow.deposit(key, amount)
    print(f"deposited {format_ether(amount)}; pool of {operator}: "
          f"{format_ether(escrow.pool(operator))} (gas {tx.gas_used})")  # fmt: skip
    return 0


def _cmd_withdraw(args: argparse.Namespace) -> int:
    escrow, (key, operator) = _escrow(args), _key(args)
    amount = escrow.pool(operator) if args.all else parse_ether(args.eth)
    if amount == 0:
        print(f"the pool of {operator} is empty: nothing to withdraw")
        return 0
    tx = escrow.withdraw(key, amount)
    print(f"withdrew {format_ether(amount)} to {operator}; pool now {format_ether(escrow.pool(operator))} "
          f"(gas {tx.gas_used})")  # fmt: skip
    return 0


def _cmd_fund_lane(args: argparse.Namespace) -> int:
    escrow, (key, operator) = _escrow(args), _key(args)
    from_pool, value = parse_ether(args.eth), parse_ether(args.send_eth)
    if from_pool == value == 0:
        raise ChainError("nothing to move: give --eth (from the pool) and/or --send-eth (sent along)")
    tx = escrow.fund_lane(key, args.drafter, args.lane, from_pool, value)
    state = escrow.lane(operator, args.drafter, args.lane)
    print(f"lane {args.lane} of {args.drafter} holds {format_ether(state.balance)} (gas {tx.gas_used})")
    return 0


def _cmd_request_thaw(args: argparse.Namespace) -> int:
    escrow, (key, operator) = _escrow(args), _key(args)
    state = escrow.lane(operator, args.drafter, args.lane)
    amount = state.balance if args.all else parse_ether(args.eth)
    tx = escrow.request_thaw(key, args.drafter, args.lane, amount)
    ready = escrow.lane(operator, args.drafter, args.lane).thaw_ready_at
    print(
        f"thawing {format_ether(amount)} of lane {args.lane} of {args.drafter}; `escrow thaw` takes it from "
        f"unix time {ready} ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(ready))}) (gas {tx.gas_used})"
    )
    return 0


def _cmd_cancel_thaw(args: argparse.Namespace) -> int:
    escrow, (key, _) = _escrow(args), _key(args)
    tx = escrow.cancel_thaw(key, args.drafter, args.lane)
    print(f"cancelled the thaw of lane {args.lane} of {args.drafter} (gas {tx.gas_used})")
    return 0


def _cmd_thaw(args: argparse.Namespace) -> int:
    escrow, (key, operator) = _escrow(args), _key(args)
    before = escrow.pool(operator)
    tx = escrow.thaw(key, args.drafter, args.lane)
    after = escrow.pool(operator)
    print(
        f"thawed {format_ether(after - before)} of lane {args.lane} of {args.drafter} into the pool; pool now "
        f"{format_ether(after)} (`escrow withdraw` takes it out) (gas {tx.gas_used})"
    )
    return 0


COMMANDS = {
    "status": _cmd_status,
    "deposit": _cmd_deposit,
    "withdraw": _cmd_withdraw,
    "fund-lane": _cmd_fund_lane,
    "request-thaw": _cmd_request_thaw,
    "cancel-thaw": _cmd_cancel_thaw,
    "thaw": _cmd_thaw,
}


def _options(name: str, q: argparse.ArgumentParser) -> None:
    d = defaults(ChainConfig)
    q.add_argument("--rpc", default=d["rpc"], help=f"Ethereum JSON-RPC URL (default {d['rpc']})")
    q.add_argument(
        "--deployments",
        type=Path,
        default=d["deployments"],
        help=f"folder of <chainId>.json (default {d['deployments']})",
    )
    key_help = "the operator's key file (DATA_DIR/keys/operator.key of its target)"
    if name == "status":
        q.add_argument("--operator", help="the operator's address (or give --key-file)")
        q.add_argument("--key-file", type=Path, help=key_help + "; only its address is used")
        q.add_argument("--json", action="store_true", help="one JSON object, amounts in wei")
        return
    q.add_argument("--key-file", type=Path, required=True, help=key_help)
    if name in ("fund-lane", "request-thaw", "cancel-thaw", "thaw"):
        q.add_argument("drafter", help="the drafter's payout address (`escrow status` lists the lanes)")
        q.add_argument("--lane", type=_lane_id, required=True, help="the lane id (`escrow status` lists them)")
    if name == "fund-lane":
        q.add_argument("--eth", default="0", help="ETH moved from the pool (default 0)")
        q.add_argument("--send-eth", default="0", help="ETH sent along with the transaction (default 0)")
    elif name in ("deposit",):
        q.add_argument("--eth", required=True, help="how much, in ETH")
    elif name in ("withdraw", "request-thaw"):
        amount = q.add_mutually_exclusive_group(required=True)
        amount.add_argument("--eth", help="how much, in ETH")
        amount.add_argument("--all", action="store_true", help="all of it (the pool's, or the lane's balance)")


def add_escrow_commands(sub) -> None:
    p = sub.add_parser(
        "escrow",
        help="an operator's drafter escrow: pool, lanes, thaws",
        description="An operator's DrafterEscrow by hand: its pool (taken back at once) and its drafters' "
        "lanes (taken back only after the thawing period). Each subcommand has its own --help.",
    )
    actions = p.add_subparsers(dest="escrow_command", required=True)
    for name, (help_, description) in ESCROW_COMMANDS.items():
        q = actions.add_parser(name, help=help_, description=description)
        _options(name, q)
        q.set_defaults(func=COMMANDS[name])
