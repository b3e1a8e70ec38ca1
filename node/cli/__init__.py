"""The `specmarket` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from node.cli.chain import add_chain_commands
from node.cli.market import add_market_commands
from node.cli.options import resolve
from node.decoding import DEFAULT_GAMMA, DRAFTERS, GenerateConfig, generate
from node.models import DEFAULT_DRAFT, DEFAULT_TARGET
from verifier.errors import SpecmarketError
from verifier.params import SamplingParams
from verifier.verify import Rule

log = logging.getLogger("specmarket")

MAX_DEMO_TOKENS = 256  # the shipped target has a 512-position window; the prompts take a few dozen

GENERATE_DEFAULTS = {
    "seed": 0,
    "max_new_tokens": 64,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "gamma": DEFAULT_GAMMA,
    "drafter": "local",
    "rule": "gumbel",
    "target_model": str(DEFAULT_TARGET),
    "draft_model": str(DEFAULT_DRAFT),
}


def _add_generate(sub) -> None:
    d = GENERATE_DEFAULTS
    p = sub.add_parser(
        "generate",
        help="generate text locally (plain or speculative decoding)",
        description=(
            "Generate a continuation with the target model. With a drafter, tokens are drafted and "
            "verified by the GUMBEL rule: the output is identical to --drafter none for the same seed."
        ),
    )
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--seed", type=int, help=f"sampling seed, shared with drafters (default {d['seed']})")
    p.add_argument("--max-new-tokens", type=int, help=f"tokens to generate (default {d['max_new_tokens']})")
    p.add_argument("--temperature", type=float, help=f"0 = greedy (default {d['temperature']})")
    p.add_argument("--top-k", type=int, help="keep the k most likely tokens; 0 = off (default 0)")
    p.add_argument("--top-p", type=float, help="nucleus sampling mass in (0, 1]; 1 = off (default 1)")
    p.add_argument("--gamma", type=int, help=f"draft tokens per round (default {d['gamma']})")
    p.add_argument("--drafter", choices=DRAFTERS, help=f"who drafts; none = plain decoding (default {d['drafter']})")
    p.add_argument(
        "--rule",
        choices=[r.value for r in Rule],
        help="verification rule; leviathan is forgeable by lying drafters (default gumbel)",
    )
    p.add_argument("--target-model", help="local HF model directory (default: shipped models/target)")
    p.add_argument("--draft-model", help="local HF model directory, same vocabulary (default: models/draft)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--config", type=Path, help="TOML file whose [generate] table supplies defaults")
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    opts = resolve(args, "generate", GENERATE_DEFAULTS)
    cfg = GenerateConfig(
        prompt=args.prompt,
        seed=opts["seed"],
        max_new_tokens=opts["max_new_tokens"],
        params=SamplingParams(opts["temperature"], opts["top_k"], opts["top_p"]),
        gamma=opts["gamma"],
        drafter=opts["drafter"],
        rule=Rule(opts["rule"]),
        target_model=Path(opts["target_model"]),
        draft_model=Path(opts["draft_model"]),
    )
    if args.json:
        print(json.dumps(generate(cfg)))
        return 0
    sys.stdout.write(cfg.prompt)
    result = generate(cfg, on_text=lambda text: (sys.stdout.write(text), sys.stdout.flush()))
    s = result["stats"]
    print(
        f"\n\n[{len(result['tokens'])} tokens, {s['tokens_per_second']} tok/s, {s['target_passes']} target passes, "
        f"acceptance {s['acceptance_rate']:.2f}, {s['mean_accepted_length']:.2f} tokens/pass]",
        file=sys.stderr,
    )
    return 0


def _add_theory(sub) -> None:
    p = sub.add_parser(
        "theory",
        help="plot Ω convergence and the S(γ) speed-up bound",
        description="Write PNGs: the simulated mean accepted length converging to Ω, and S against γ.",
    )
    p.add_argument("--alpha", type=float, nargs="+", default=[0.5, 0.7, 0.8, 0.9], help="acceptance rates α")
    p.add_argument("--cost", type=float, default=0.1, help="draft/target cost ratio c (default 0.1)")
    p.add_argument("--gamma", type=int, default=4, help="γ for the convergence plot (default 4)")
    p.add_argument("--rounds", type=int, default=2000, help="simulated rounds (default 2000)")
    p.add_argument("--measured", type=Path, help="a bench_local.py JSON whose measured points are overlaid")
    p.add_argument("--out", type=Path, required=True, help="output directory for the PNGs")
    p.set_defaults(func=_cmd_theory)


def _cmd_theory(args: argparse.Namespace) -> int:
    from node.lab.plots import write_theory_plots

    for path in write_theory_plots(args.alpha, args.cost, args.gamma, args.rounds, args.out, args.measured):
        print(path)
    return 0


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="local demo: plain vs speculative vs hostile drafters, and the forgery")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--out", type=Path, default=Path("demo_out"), help="where demo.json and plots go")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from node.lab.demo_local import run_demo

    return run_demo(args.max_new_tokens, args.out)


def _add_demo_net(sub) -> None:
    p = sub.add_parser(
        "demo-net",
        help="the networked demo (make demo): bonded targets, drafter peers, slashed cheats, and report/",
        description=(
            "Start anvil (npm), deploy the bond contract, run a bonded target with two honest and two hostile "
            "drafter peers and a non-speculating bonded target, send the same prompts to both over the HTTP API, "
            "re-execute every answer as a challenger would, then challenge two cheating operators' answers (one "
            "speculating, one not), resolved by two referee processes (the 2-of-3 quorum) that slash them; "
            "measure the forgery row and an in-process gamma sweep, and write the report (README.md, PNGs, "
            "demo_net.json). Every process it starts is stopped at the end, on an error or Ctrl-C too."
        ),
    )
    p.add_argument("--max-new-tokens", type=_demo_tokens, default=48, help="tokens per prompt, 1-256 (default 48)")
    p.add_argument(
        "--out", type=Path, default=Path("report"), help="where README.md, the PNGs and demo_net.json go (report/)"
    )
    p.add_argument("--quick", action="store_true", help="two prompts of at most 16 tokens (what CI runs)")
    p.set_defaults(func=_cmd_demo_net)


def _demo_tokens(text: str) -> int:
    value = int(text) if text.strip().lstrip("-").isdigit() else -1
    if not 1 <= value <= MAX_DEMO_TOKENS:
        raise argparse.ArgumentTypeError(f"must be an integer in [1, {MAX_DEMO_TOKENS}], got {text!r}")
    return value


def _cmd_demo_net(args: argparse.Namespace) -> int:
    from node.lab.demo_net import NetDemoConfig, run_demo_net

    return run_demo_net(NetDemoConfig(out=args.out, max_tokens=args.max_new_tokens, quick=args.quick))


def _add_bench(sub) -> None:
    from node.lab.bench_local import BenchConfig

    p = sub.add_parser(
        "bench-local",
        help="benchmark plain / speculative / HF assisted generation side by side",
        description="One process, one run, same prompts and pair; prints ratios and writes JSON.",
    )
    p.add_argument("--max-new-tokens", type=int, default=BenchConfig.max_new_tokens)
    p.add_argument("--gamma", type=int, default=BenchConfig.gamma)
    p.add_argument("--temperatures", type=float, nargs="+", default=list(BenchConfig.temperatures))
    p.add_argument("--repeats", type=int, default=BenchConfig.repeats, help="interleaved repetitions (median)")
    p.add_argument("--out", type=Path, default=BenchConfig.out, help="JSON output path")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    from node.lab.bench_local import BenchConfig, run_bench

    run_bench(BenchConfig(args.max_new_tokens, args.gamma, tuple(args.temperatures), args.repeats, args.out))
    return 0


def _add_bench_p2p(sub) -> None:
    from node.bench_p2p import add_arguments

    p = sub.add_parser(
        "bench-p2p",
        help="benchmark drafter peers over libp2p (honest, hostile) against plain, local and HF assisted",
        description="One process plus drafter processes, same prompts and pair; prints ratios and writes JSON.",
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_bench_p2p)


def _cmd_bench_p2p(args: argparse.Namespace) -> int:
    from node.bench_p2p import config_from_args, run_bench_p2p

    run_bench_p2p(config_from_args(args))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specmarket",
        description="Verifiable, permissionless speculative decoding (see README.md).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_theory(sub)
    _add_demo(sub)
    _add_demo_net(sub)
    _add_bench(sub)
    _add_bench_p2p(sub)
    add_market_commands(sub)
    add_chain_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return args.func(args)
    except SpecmarketError as exc:
        print(f"specmarket: error: {exc}", file=sys.stderr)
        return 2
    except BaseExceptionGroup as group:  # a trio nursery's: report its one SpecmarketError plainly
        errors, rest = group.split(SpecmarketError)
        if errors is None or rest is not None:
            raise
        leaf: BaseException = errors
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        print(f"specmarket: error: {leaf}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specmarket: interrupted", file=sys.stderr)
        return 130
