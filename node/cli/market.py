"""`specmarket target | drafter | ask`: arguments -> TargetConfig / DrafterConfig / AskConfig.

Defaults come from the config dataclasses (shown in --help); precedence: command line > the
``[target]`` / ``[drafter]`` table of --config > the dataclass defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import webbrowser
from pathlib import Path

from node.chain.cheat import Cheat, cheats_help
from node.cli.options import add_kernel_option, add_pair_option, defaults, resolve
from node.client.ask import AskConfig
from node.drafter.config import DrafterConfig
from node.drafter.strategies import STRATEGIES
from node.runtime.lifecycle import serve_until_signalled
from node.runtime.logs import node_logging
from node.target.config import TargetConfig
from verifier.errors import InvalidParams


def _add_target(sub) -> None:
    d = defaults(TargetConfig)
    p = sub.add_parser(
        "target",
        help="run the target node (verifier + rendezvous point + HTTP API)",
        description=(
            "Serve the target model: drafter peers register on this node's rendezvous point and are asked for "
            "drafts; every token is verified (GUMBEL rule), so output never depends on the drafters. Prints the "
            "libp2p multiaddr (give it to drafters as --bootstrap) and the HTTP address (OpenAI-compatible API)."
        ),
    )
    p.add_argument("--listen", help=f"libp2p listen multiaddr (default {d['listen']})")
    p.add_argument("--http", help=f"HTTP API HOST:PORT, port 0 = any free port (default {d['http']})")
    p.add_argument("--data-dir", type=Path, help=f"identity key, drafter ledger, receipts (default {d['data_dir']})")
    p.add_argument(
        "--gamma",
        type=int,
        help=f"the most draft tokens a round verifies; drafters may send fewer (default {d['gamma']})",
    )
    p.add_argument(
        "--draft-deadline-ms",
        type=float,
        help="longest wait for a draft per round (default: two of the target's measured plain decoding steps, "
        "at least 100 ms)",
    )
    p.add_argument(
        "--max-drafters",
        type=int,
        help="drafter peers asked per job; 0 = none (a client may still draft for itself: ask --draft) "
        f"(default {d['max_drafters']})",
    )
    p.add_argument(
        "--max-jobs",
        type=int,
        help="jobs at once over HTTP and libp2p; one more is refused at once (HTTP 503 with Retry-After, a "
        f"libp2p error frame), never queued (default {d['max_jobs']})",
    )
    p.add_argument(
        "--batch-rows",
        type=int,
        help="concurrent jobs share the target's verification passes, up to this many rows a pass, bit for bit "
        f"as if each ran alone (the packed qwen2.5-coder target only); 0 = off (default {d['batch_rows']})",
    )
    p.add_argument(
        "--tree-nodes",
        type=int,
        help="merge every drafter's answer to a round, and a prompt-lookup branch of the target's own, into one "
        "tree of drafts of up to this many nodes, verified exactly in one pass; an accepted token earns only the "
        "best-ranked drafter that proposed it (the packed qwen2.5-coder target only); 0 = the best drafter's draft "
        f"alone (default {d['tree_nodes']})",
    )
    p.add_argument(
        "--wait-budget",
        type=float,
        help="share of a job that waiting for drafts that bought no token may cost before a job slower than "
        f"plain decoding stops drafting; 0 = never stop (default {d['wait_budget']})",
    )
    add_pair_option(p, d["pair"])
    add_kernel_option(p, d["kernel"])
    p.add_argument("--target-model", type=Path, help="local HF model directory (default: the pair's target)")
    p.add_argument(
        "--chain",
        metavar="RPC_URL",
        help="bond on this chain and sign a receipt for every answer (e.g. http://127.0.0.1:8545; default: unbonded)",
    )
    p.add_argument(
        "--deployments", type=Path, help=f"folder of <chainId>.json deployments (default {d['deployments']})"
    )
    p.add_argument(
        "--operator-key", type=Path, help="operator private key file, created 0600 if missing (default DATA_DIR/keys)"
    )
    p.add_argument("--bond", help="bond in ETH, registered or topped up to at start (default: the contract's minimum)")
    p.add_argument(
        "--drafter-price",
        type=int,
        metavar="WEI",
        help="what a bonded node pays drafters per accepted draft token, in wei, from its DrafterEscrow (never "
        f"the bond); announced in every draft session; 0 = unpaid (default {d['drafter_price']})",
    )
    p.add_argument(
        "--escrow-deposit",
        metavar="ETH",
        help=f"top the operator's pool in the drafter escrow up to this at start (default {d['escrow_deposit']})",
    )
    p.add_argument(
        "--escrow-floor",
        metavar="ETH",
        help=f"below this much in the escrow pool the node warns and /health says so (default {d['escrow_floor']})",
    )
    p.add_argument(
        "--lane-deposit",
        metavar="ETH",
        help="the least a drafter's lane is topped up by when it cannot cover what is owed plus one more job "
        f"(from the pool first; default {d['lane_deposit']})",
    )
    p.add_argument(
        "--cheat",
        choices=[c.value for c in Cheat],
        help=f"a DISHONEST operator for tests and demos: {cheats_help()} (default none)",
    )
    p.add_argument(
        "--new-receipt-store",
        action="store_true",
        default=None,
        help="start a new receipt store (the old one is moved aside) where the old one is missing although the "
        "key is registered, predates the store format, or belongs to another key or deployment; refused otherwise, "
        "since a node without its receipts could sign a second, different receipt for a request (slashable)",
    )
    p.add_argument(
        "--open",
        dest="open_dashboard",
        action="store_true",
        default=None,
        help="open the node's live dashboard (GET /) in a web browser once it serves",
    )
    p.add_argument("--config", type=Path, help="TOML file whose [target] table supplies defaults")
    p.set_defaults(func=_cmd_target)


def _cmd_target(args: argparse.Namespace) -> int:
    import trio

    from node.target.node import TargetNode

    cfg = TargetConfig(**resolve(args, "target", TargetConfig))
    node_logging(args.verbose)
    node = TargetNode(cfg)

    def announce(info: dict) -> None:
        for addr in info["multiaddrs"]:
            print(f"multiaddr: {addr}", flush=True)
        print(f"http: {info['http']}", flush=True)
        dashboard = f"{info['http']}/"
        print(f"dashboard: {dashboard}", flush=True)
        if cfg.open_dashboard and not webbrowser.open(dashboard):
            print(f"no web browser here: open {dashboard} in one", file=sys.stderr, flush=True)

    try:
        trio.run(serve_until_signalled, node.run, announce)
    finally:
        node.close()
    return 0


def _add_drafter(sub) -> None:
    p = sub.add_parser(
        "drafter",
        help="run a drafter peer that drafts tokens for a target (`drafter redeem`: cash its vouchers)",
        description=(
            "Join a target's drafting market: register on its rendezvous point (only the bootstrap multiaddr is "
            "needed) and serve draft sessions with a local draft model. Drafters post no bond and are never "
            "slashed. The hostile strategies exist for tests and demos; none can change the target's output. "
            "A bonded target pays --payout for accepted draft tokens with signed vouchers, kept in DATA_DIR's "
            "wallet; `specmarket drafter redeem` cashes them at the operators' escrows (see its --help)."
        ),
    )
    _drafter_run_options(p)
    p.set_defaults(func=_cmd_drafter, overlap=None)  # --no-overlap not given: the config decides
    actions = p.add_subparsers(dest="drafter_command", metavar="[run | redeem]", help="what to do (default run)")
    # SUPPRESS: an option not given after the subcommand keeps its value from before it
    run = actions.add_parser(
        "run",
        help="serve drafts (the default: `specmarket drafter --bootstrap ...` is the same)",
        description="Serve drafts for the target at --bootstrap; the same as `specmarket drafter` without `run`.",
        argument_default=argparse.SUPPRESS,
    )
    _drafter_run_options(run)
    redeem = actions.add_parser(
        "redeem",
        help="redeem the wallet's vouchers and print what was paid, in ETH",
        description=(
            "Redeem the newest voucher from each operator in DATA_DIR's wallet at its escrow, from the payout "
            "address's key (only the voucher's drafter may redeem it), and print one line per voucher: what was "
            "paid, in ETH, or why nothing was. Exits with status 2 when a voucher could not be redeemed because "
            "of an error (no gas, another key's voucher, another chain); a voucher with nothing new is no error."
        ),
        argument_default=argparse.SUPPRESS,
    )
    _redeem_options(redeem)
    redeem.set_defaults(func=_cmd_redeem)


def _drafter_run_options(p: argparse.ArgumentParser) -> None:
    """The options of `specmarket drafter` (and `drafter run`)."""
    d = defaults(DrafterConfig)
    p.add_argument("--bootstrap", help="the target's multiaddr, ending in /p2p/<peer id> (required)")
    add_pair_option(p, d["pair"])
    p.add_argument("--model", type=Path, help="draft model directory (default: the pair's draft)")
    add_kernel_option(p, d["kernel"])
    p.add_argument("--strategy", choices=STRATEGIES, help=f"honest, or a hostile behaviour (default {d['strategy']})")
    p.add_argument("--data-dir", type=Path, help=f"identity key and wallet (default {d['data_dir']})")
    p.add_argument("--listen", help=f"libp2p listen multiaddr (default {d['listen']})")
    p.add_argument("--slow-ms", type=int, help=f"delay of the slow and stall strategies (default {d['slow_ms']})")
    p.add_argument("--seed", type=int, help=f"seed of the random/flaky strategies (default {d['seed']})")
    p.add_argument("--threads", type=int, help=f"torch threads for drafting (default {d['threads']})")
    p.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="answer each round only when asked: no early drafts while the target verifies (default: overlap on)",
    )
    p.add_argument(
        "--min-confidence",
        type=float,
        metavar="P",
        help="end a draft block at the first token the draft gives a probability below P, that token included: "
        f"long rounds where the draft is sure, short ones where it is not; 0: always the target's γ "
        f"(default {d['min_confidence']})",
    )
    p.add_argument(
        "--target-http",
        metavar="URL",
        help="the target's HTTP API: when registering at --bootstrap keeps failing, its /health says where the "
        "target (same peer id) listens now (default: none, retry --bootstrap)",
    )
    p.add_argument(
        "--payout",
        metavar="ADDRESS",
        help="where targets pay this drafter (sent to each target over the authenticated session; "
        "`specmarket keys new --out FILE` makes a key and prints its address; default: unpaid)",
    )
    p.add_argument(
        "--rpc",
        metavar="URL",
        help="a chain to check, after each voucher, that the operator's escrow covers it (stop drafting for it "
        "otherwise; default: no checks)",
    )
    p.add_argument("--key-file", type=Path, help="the payout address's private key file (for --redeem-above)")
    p.add_argument(
        "--min-price",
        type=int,
        metavar="WEI",
        help="refuse a session whose price per accepted draft token is below WEI, before any work "
        "(default: 1 with --payout, so a drafter that asks to be paid never drafts for free; 0 without)",
    )
    p.add_argument(
        "--redeem-above",
        type=int,
        metavar="WEI",
        help="with --rpc and --key-file: redeem a target's vouchers as soon as what is unredeemed reaches WEI "
        "(0: after every voucher), so an operator that empties its escrow takes at most about one job's pay "
        "(default: redeem by hand, `specmarket drafter redeem`)",
    )
    p.add_argument("--config", type=Path, help="TOML file whose [drafter] table supplies defaults")


def _redeem_options(p: argparse.ArgumentParser) -> None:
    d = defaults(DrafterConfig)
    p.add_argument("--rpc", metavar="URL", help="the chain to redeem on, e.g. http://127.0.0.1:8545 (required)")
    p.add_argument(
        "--key-file",
        type=Path,
        help="the payout address's private key file (`specmarket keys new --out FILE` makes one; required)",
    )
    p.add_argument(
        "--data-dir", type=Path, help=f"the drafter's data dir, which holds wallet.json (default {d['data_dir']})"
    )
    p.add_argument("--config", type=Path, help="TOML file whose [drafter] table supplies defaults (rpc, key-file)")


def _cmd_drafter(args: argparse.Namespace) -> int:
    import torch
    import trio

    from node.drafter.peer import DrafterNode

    node_logging(args.verbose)
    options = resolve(args, "drafter", DrafterConfig)
    if not options["bootstrap"]:
        raise InvalidParams("--bootstrap MULTIADDR is required (the target prints it at start)")
    cfg = DrafterConfig(**options)
    torch.set_num_threads(cfg.threads)
    node = DrafterNode(cfg)

    def announce(addrs: list[str]) -> None:
        for addr in addrs:
            print(f"multiaddr: {addr}", flush=True)
        print(f"registered: {cfg.strategy}", flush=True)

    trio.run(serve_until_signalled, node.run, announce, node.request_stop)
    return 0


def _cmd_redeem(args: argparse.Namespace) -> int:
    """Each voucher's line once, on stdout; status 2 (one line on stderr) when one failed."""
    from node.chain.keys import read_key
    from node.drafter.redeem import RedeemError, redeem_all

    node_logging(args.verbose)
    options = resolve(args, "drafter", DrafterConfig)
    if not options.get("rpc") or options.get("key_file") is None:
        raise InvalidParams("redeem needs --rpc URL and --key-file FILE (the payout address's key)")
    rows = redeem_all(Path(options["data_dir"]), options["rpc"], read_key(Path(options["key_file"])))
    for row in rows:
        print(row.line(), flush=True)
    if not rows:
        print(f"no vouchers in {options['data_dir']}: nothing to redeem")
    failed = sum(1 for row in rows if row.error)
    if failed:
        raise RedeemError(f"{failed} of {len(rows)} voucher(s) not redeemed (the line of each says why)")
    return 0


def _add_ask(sub) -> None:
    d = defaults(AskConfig)
    p = sub.add_parser(
        "ask",
        help="ask a target node for a completion (libp2p multiaddr or HTTP URL)",
        description=(
            "Stream a completion from a target node; --json prints the whole answer with its stats. With --chat "
            "the prompt is one user message (after --system, if given) sent to /v1/chat/completions, so the target "
            "applies its model's chat template; the receipt then covers the templated prompt tokens. A bonded "
            "target's receipt is checked against this machine's copy of the model (--pair / --target-model: the "
            "prompt's tokens, the stop tokens, the model hash) and the chain (--rpc, --deployments: the operator is "
            "registered and bonded, the receipt fresh). What cannot be checked (no model files here, no chain "
            "answering) is named on stderr in 'warning: not checked: ...' lines, and the answer and --receipt-out "
            "are still given: exit status 0. A check that fails, or a failed request, exits with status 2."
        ),
    )
    p.add_argument("prompt", help="prompt text (with --chat: the user's message)")
    p.add_argument("--target", required=True, help="the target's multiaddr (/ip4/.../p2p/...) or http:// URL")
    p.add_argument("--seed", type=int, help="sampling seed (default: the target picks one and reports it)")
    p.add_argument("--max-new-tokens", type=int, help=f"tokens to generate (default {d['max_new_tokens']})")
    p.add_argument("--temperature", type=float, help=f"0 = greedy (default {d['temperature']})")
    p.add_argument("--top-k", type=int, help=f"sample among the K likeliest tokens; 0 = off (default {d['top_k']})")
    p.add_argument("--top-p", type=float, help=f"nucleus mass in (0, 1] (default {d['top_p']})")
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        default=None,
        help=f"run to --max-new-tokens past the model's end-of-sequence tokens (default {d['ignore_eos']})",
    )
    p.add_argument(
        "--receipt-out",
        type=Path,
        help="save the answer's signed receipt here (for `specmarket challenge`), even when the chain cannot be "
        "checked (a warning says so)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        default=None,
        help=f"ask /v1/chat/completions with the prompt as the user's message; HTTP targets only (default {d['chat']})",
    )
    p.add_argument("--system", help="with --chat: a system message before the user's (default none)")
    add_pair_option(p, d["pair"])
    p.add_argument("--target-model", type=Path, help="the model the target must be bonded for (default: the pair's)")
    p.add_argument(
        "--verify-model",
        action="store_true",
        default=None,
        help="hash the model's files again instead of reading the hash cached for them (kept by file size and "
        f"times in the user's data dir; default {d['verify_model']})",
    )
    p.add_argument("--rpc", help=f"chain to check a receipt's operator on (default {d['rpc']})")
    p.add_argument("--deployments", type=Path, help=f"trusted <chainId>.json deployments (default {d['deployments']})")
    p.add_argument(
        "--draft",
        action="store_true",
        default=None,
        help="draft for your own request with a draft model on this machine, over the same libp2p stream: the "
        "target verifies your drafts (the answer is the target's whatever they are) and never pays for them; "
        f"libp2p targets only (default {d['draft']})",
    )
    p.add_argument("--draft-model", type=Path, help="with --draft: the draft model directory (default: the pair's)")
    p.add_argument("--config", type=Path, help="TOML file whose [ask] table supplies defaults")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    p.set_defaults(func=_cmd_ask)


def _cmd_ask(args: argparse.Namespace) -> int:
    """The answer on stdout (streamed, or one JSON object with --json, whose ``not_checked`` lists
    what the receipt check left out); the receipt and the stats on stderr."""
    from node.client.ask import ask

    if not args.verbose:  # py-libp2p logs each failed dial itself; the error line says why already
        logging.getLogger("libp2p").setLevel(logging.CRITICAL)

    def on_text(text: str) -> None:
        if not args.json:
            sys.stdout.write(text)
            sys.stdout.flush()

    cfg = AskConfig(**resolve(args, "ask", AskConfig))
    summary, report = ask(cfg, on_text)
    if args.json:
        print(json.dumps({**summary, "not_checked": list(report.not_checked)}))
        for line in report.lines()[1:]:
            print(line, file=sys.stderr)
        return 0
    print(file=sys.stdout)
    for line in report.lines():
        print(line, file=sys.stderr)
    s = summary.get("stats", {})
    accepted, drafted = s.get("client_tokens_accepted", 0), s.get("client_draft_tokens", 0)
    own = f", your drafts: {accepted} of {drafted} tokens accepted" if cfg.draft else ""
    print(
        f"[{len(summary.get('tokens', []))} tokens, seed {summary.get('seed')}, "
        f"acceptance {s.get('acceptance_rate', 0):.2f}, {s.get('target_passes', 0)} target passes{own}]",
        file=sys.stderr,
    )
    return 0


def add_market_commands(sub) -> None:
    _add_target(sub)
    _add_drafter(sub)
    _add_ask(sub)
