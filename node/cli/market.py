"""`specmarket target | drafter | ask`: the networked market's processes and its client."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path

import trio

from node.chain.cheat import Cheat
from node.chain.deployment import DEFAULT_DEPLOYMENTS_DIR
from node.cli.options import resolve
from node.decoding import DEFAULT_GAMMA
from node.models import DEFAULT_DRAFT, DEFAULT_TARGET
from node.drafter.strategies import DEFAULT_SLOW_MS, STRATEGIES

log = logging.getLogger("specmarket")

GRACE_S = 5.0  # time a drafter gets to withdraw its registration after Ctrl-C

TARGET_DEFAULTS = {
    "listen": "/ip4/127.0.0.1/tcp/0",
    "http": "127.0.0.1:8000",
    "data_dir": None,
    "gamma": DEFAULT_GAMMA,
    "draft_deadline_ms": 100.0,
    "max_drafters": 4,
    "target_model": str(DEFAULT_TARGET),
    "chain": None,
    "deployments": str(DEFAULT_DEPLOYMENTS_DIR),
    "operator_key": None,
    "bond": None,
    "cheat": "none",
}
DRAFTER_DEFAULTS = {
    "bootstrap": None,
    "model": str(DEFAULT_DRAFT),
    "strategy": "honest",
    "data_dir": None,
    "listen": "/ip4/127.0.0.1/tcp/0",
    "slow_ms": DEFAULT_SLOW_MS,
    "seed": 0,
    "threads": 1,
}


def default_data_dir(role: str) -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "specmarket" / role


def _node_logging(verbose: bool) -> None:
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("libp2p", "multiaddr", "hypercorn", "transformers", "httpx"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    # py-libp2p 0.8.1's rendezvous service logs an ERROR with an empty message each time a client
    # closes its stream after a (successful) registration; keep it out of the operator's log.
    logging.getLogger("libp2p.discovery.rendezvous.service").setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def freeze_startup_heap() -> None:
    """Call once a long-running process has loaded its models: move the ~500k objects that torch,
    transformers and libp2p leave behind into the collector's permanent generation (``gc.freeze``,
    Python 3.7+). Full collections then skip them, which removes ~0.5 s pauses while serving and
    makes interpreter shutdown fast: without it every target, drafter and referee spent 2-10 s
    garbage-collecting at exit (measured with py-spy on this 2-core box, 10 s with 11 processes)."""
    gc.collect()
    gc.freeze()


async def _serve_until_signalled(run, announce, request_stop=None) -> None:
    """Run ``run`` until SIGINT/SIGTERM; ``announce(info)`` prints where it serves. On a signal,
    ``request_stop()`` (if given) gets GRACE_S to wind down before everything is cancelled."""
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            done = trio.Event()

            async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
                await run(task_status=task_status)
                done.set()

            info = await nursery.start(serve)
            freeze_startup_heap()
            announce(info)
            async for signum in signals:
                log.info("received %s; shutting down", signal.Signals(signum).name)
                if request_stop is not None:
                    request_stop()
                    with trio.move_on_after(GRACE_S):
                        await done.wait()
                nursery.cancel_scope.cancel()
                break


def _add_target(sub) -> None:
    d = TARGET_DEFAULTS
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
    p.add_argument(
        "--data-dir", type=Path, help="identity key and drafter ledger (default ~/.local/share/specmarket/target)"
    )
    p.add_argument("--gamma", type=int, help=f"draft tokens per round (default {d['gamma']})")
    p.add_argument("--draft-deadline-ms", type=float, help="longest wait for a draft per round (default 100)")
    p.add_argument("--max-drafters", type=int, help="drafters asked per job; 0 = plain decoding (default 4)")
    p.add_argument("--target-model", help="local HF model directory (default: shipped models/target)")
    p.add_argument(
        "--chain",
        metavar="RPC_URL",
        help="bond on this chain and sign a receipt for every answer (e.g. http://127.0.0.1:8545; default: unbonded)",
    )
    p.add_argument("--deployments", help="folder of deployments/<chainId>.json (default: the repo's deployments/)")
    p.add_argument("--operator-key", help="operator private key file, created 0600 if missing (default: DATA_DIR/keys)")
    p.add_argument("--bond", help="bond in ETH, registered or topped up to at start (default: the contract's minimum)")
    p.add_argument(
        "--cheat",
        choices=[c.value for c in Cheat],
        help="a DISHONEST operator for tests and demos: answer with the draft model, or flip one token (default none)",
    )
    p.add_argument("--config", type=Path, help="TOML file whose [target] table supplies defaults")
    p.set_defaults(func=_cmd_target)


def _operator_config(o: dict, data_dir: Path):
    from node.chain.deployment import parse_ether
    from node.chain.operator import OperatorConfig
    from verifier.errors import InvalidParams

    if o["cheat"] != "none" and not o["chain"]:
        raise InvalidParams("--cheat only makes sense for a bonded node: add --chain RPC_URL")
    if not o["chain"]:
        return None
    return OperatorConfig(
        rpc=o["chain"],
        deployments_dir=Path(o["deployments"]),
        key_file=Path(o["operator_key"] or data_dir / "keys" / "operator.key"),
        bond_wei=parse_ether(o["bond"]) if o["bond"] is not None else None,
        cheat=Cheat(o["cheat"]),
    )


def _cmd_target(args: argparse.Namespace) -> int:
    from node.target.node import TargetConfig, TargetNode

    _node_logging(args.verbose)
    o = resolve(args, "target", TARGET_DEFAULTS)
    data_dir = Path(o["data_dir"] or default_data_dir("target"))
    cfg = TargetConfig(
        listen=o["listen"],
        http=o["http"],
        data_dir=data_dir,
        gamma=int(o["gamma"]),
        draft_deadline_ms=float(o["draft_deadline_ms"]),
        max_drafters=int(o["max_drafters"]),
        target_model=Path(o["target_model"]),
        operator=_operator_config(o, data_dir),
    )
    node = TargetNode(cfg)

    def announce(info: dict) -> None:
        for addr in info["multiaddrs"]:
            print(f"multiaddr: {addr}", flush=True)
        print(f"http: {info['http']}", flush=True)

    try:
        trio.run(_serve_until_signalled, node.run, announce)
    finally:
        node.close()
    return 0


def _add_drafter(sub) -> None:
    d = DRAFTER_DEFAULTS
    p = sub.add_parser(
        "drafter",
        help="run a drafter peer that drafts tokens for a target",
        description=(
            "Join a target's drafting market: register on its rendezvous point (only the bootstrap multiaddr is "
            "needed) and serve draft sessions with a local draft model. Drafters post no bond and are never "
            "slashed. The hostile strategies exist for tests and demos; none can change the target's output."
        ),
    )
    p.add_argument("--bootstrap", help="the target's multiaddr, ending in /p2p/<peer id> (required)")
    p.add_argument("--model", help="draft model directory (default: shipped models/draft)")
    p.add_argument("--strategy", choices=STRATEGIES, help="honest, or a hostile behaviour (default honest)")
    p.add_argument("--data-dir", type=Path, help="identity key (default ~/.local/share/specmarket/drafter)")
    p.add_argument("--listen", help=f"libp2p listen multiaddr (default {d['listen']})")
    p.add_argument("--slow-ms", type=int, help=f"delay of the slow strategy (default {d['slow_ms']})")
    p.add_argument("--seed", type=int, help="seed of the random/flaky strategies (default 0)")
    p.add_argument("--threads", type=int, help="torch threads for drafting (default 1)")
    p.add_argument("--config", type=Path, help="TOML file whose [drafter] table supplies defaults")
    p.set_defaults(func=_cmd_drafter)


def _cmd_drafter(args: argparse.Namespace) -> int:
    import torch

    from node.drafter.peer import DrafterConfig, DrafterNode
    from verifier.errors import InvalidParams

    _node_logging(args.verbose)
    o = resolve(args, "drafter", DRAFTER_DEFAULTS)
    if not o["bootstrap"]:
        raise InvalidParams("--bootstrap MULTIADDR is required (the target prints it at start)")
    cfg = DrafterConfig(
        bootstrap=o["bootstrap"],
        model_dir=Path(o["model"]),
        strategy=o["strategy"],
        data_dir=Path(o["data_dir"] or default_data_dir("drafter")),
        listen=o["listen"],
        slow_ms=int(o["slow_ms"]),
        seed=int(o["seed"]),
    )
    if not 1 <= int(o["threads"]) <= 256:
        raise InvalidParams(f"--threads must be in [1, 256], got {o['threads']}")
    torch.set_num_threads(int(o["threads"]))  # a tiny draft model gains nothing from more; leave cores to others
    node = DrafterNode(cfg)

    def announce(addrs: list[str]) -> None:
        for addr in addrs:
            print(f"multiaddr: {addr}", flush=True)
        print(f"registered: {cfg.strategy}", flush=True)

    trio.run(_serve_until_signalled, node.run, announce, node.request_stop)
    return 0


def _add_ask(sub) -> None:
    p = sub.add_parser(
        "ask",
        help="ask a target node for a completion (libp2p multiaddr or HTTP URL)",
        description="Stream a completion from a target node; --json prints the whole answer with its stats.",
    )
    p.add_argument("prompt", help="prompt text")
    p.add_argument("--target", required=True, help="the target's multiaddr (/ip4/.../p2p/...) or http:// URL")
    p.add_argument("--seed", type=int, help="sampling seed (default: the target picks one and reports it)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1)")
    p.add_argument(
        "--receipt-out", type=Path, help="save the answer's signed receipt here (for `specmarket challenge`)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object at the end instead of streaming")
    p.set_defaults(func=_cmd_ask)


def _cmd_ask(args: argparse.Namespace) -> int:
    def on_text(text: str) -> None:
        if not args.json:
            sys.stdout.write(text)
            sys.stdout.flush()

    if args.target.startswith(("http://", "https://")):
        from node.client.http import stream_completion

        summary = stream_completion(
            args.target,
            args.prompt,
            max_tokens=args.max_new_tokens,
            seed=args.seed,
            temperature=args.temperature,
            top_p=args.top_p,
            on_text=on_text,
        )
    else:
        summary = trio.run(_ask_p2p, args, on_text)
    receipt_line = _check_receipt(summary, args.receipt_out)
    if args.json:
        print(json.dumps(summary))
    else:
        if receipt_line:
            print(receipt_line, file=sys.stderr)
        print(file=sys.stdout)
        s = summary.get("stats", {})
        print(
            f"[{len(summary.get('tokens', []))} tokens, seed {summary.get('seed')}, "
            f"acceptance {s.get('acceptance_rate', 0):.2f}, {s.get('target_passes', 0)} target passes]",
            file=sys.stderr,
        )
    return 0


async def _ask_p2p(args: argparse.Namespace, on_text) -> dict:
    from node.client_p2p import ask_p2p, make_request

    request = make_request(args.prompt, args.max_new_tokens, args.temperature, args.top_p, args.seed)
    done = await ask_p2p(args.target, request, on_text)
    return {
        "job": done.job,
        "tokens": list(done.tokens),
        "seed": done.seed,
        "stats": done.stats,
        "credits": done.credits,
        "receipt": json.loads(done.receipt) if done.receipt else None,
    }


def _check_receipt(summary: dict, out: Path | None) -> str:
    """Verify the answer's receipt (signature, hashes, and that it covers the tokens received);
    save it to ``out``. Returns a line for the user ("" when the node is not bonded)."""
    from node.chain.receipts import ReceiptError, SignedReceipt

    data = summary.get("receipt")
    if data is None:
        if out is not None:
            raise ReceiptError("the target sent no receipt (it is not bonded), so there is nothing to save")
        return ""
    signed = SignedReceipt.from_json(data)
    signed.check()
    if list(signed.output) != list(summary.get("tokens", [])):
        raise ReceiptError("the receipt does not cover the tokens received")
    if out is not None:
        out.write_text(signed.dumps() + "\n")
    saved = f", saved to {out}" if out is not None else ""
    return f"[receipt signed by operator {signed.receipt.operator} on chain {signed.domain.chain_id}{saved}]"


def add_market_commands(sub) -> None:
    _add_target(sub)
    _add_drafter(sub)
    _add_ask(sub)
