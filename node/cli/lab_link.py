"""`specmarket bench-link`: plain `ask`, `ask --draft` and the market's drafters across a slow link."""

from __future__ import annotations

import argparse
from pathlib import Path

from node.cli.options import add_pair_option, defaults, positive_int
from node.lab.config import LinkBenchConfig


def add_bench_link(sub) -> None:
    d = defaults(LinkBenchConfig)
    p = sub.add_parser(
        "bench-link",
        help="who should draft across a slow link: ask --draft against plain ask against the market's drafters",
        description=(
            "At each round trip, plain `ask`, `ask --draft` (this machine drafts for its own request) and plain "
            "`ask` to a target with an honest drafter peer beside it, each through a userspace link on loopback "
            "that delays every chunk by half the round trip (± a tenth). The modes are interleaved prompt by "
            "prompt; every answer is checked against plain decoding's. Prints each mode's tokens/s and its ratio "
            "to plain at the same round trip, and the round trip from which client drafting stops paying."
        ),
    )
    p.add_argument("--rtts", type=int, nargs="+", default=list(d["rtts_ms"]), help=f"round trips in ms {d['rtts_ms']}")
    p.add_argument("--prompts", type=positive_int, default=d["prompts"], help=f"code prompts (default {d['prompts']})")
    p.add_argument("--max-new-tokens", type=positive_int, default=d["max_new_tokens"], help="tokens per answer")
    p.add_argument("--temperature", type=float, default=d["temperature"], help=f"default {d['temperature']}")
    p.add_argument("--repeats", type=positive_int, default=d["repeats"], help="interleaved repetitions (median)")
    p.add_argument("--out", type=Path, help="write bench_link.json into this directory")
    p.add_argument(
        "--wait-budget",
        type=float,
        help="the targets' --wait-budget (default: theirs); 0 = never stop drafting, to see what drafting alone costs",
    )
    add_pair_option(p, d["pair"])
    p.set_defaults(func=_cmd_bench_link, pair=d["pair"])


def _cmd_bench_link(args: argparse.Namespace) -> int:
    from node.lab.bench_link import run_bench_link

    names = ("prompts", "max_new_tokens", "temperature", "repeats", "out", "pair", "wait_budget")
    run_bench_link(LinkBenchConfig(rtts_ms=tuple(args.rtts), **{n: getattr(args, n) for n in names}))
    return 0
