"""`specmarket train`: retrain the shipped tiny pair (``node.training.pipeline``); `specmarket train-draft`:
distil the real target's draft (``node.training.distill``)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from node.cli.options import defaults, positive_int, resolve
from node.training.config import PipelineConfig
from node.training.distill.config import STAGES, DistillConfig


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _stages(text: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in text.split(","))
    if not chosen or set(chosen) - set(STAGES):
        raise argparse.ArgumentTypeError(f"stages are a comma-separated subset of {','.join(STAGES)}, got {text!r}")
    return chosen


def add_training_commands(sub) -> None:
    _add_train(sub)
    d = defaults(DistillConfig)
    p = sub.add_parser(
        "train-draft",
        help="distil the SmolLM2 target's draft on this machine (resumable; long: run it in the background)",
        description=(
            "Stages: labels (the target's top-k log-probs over its own teacher answers and raw stdlib code), "
            "train (the draft: the target's embedding, a few of its layers as the start, a frequency-ranked "
            "sub-vocabulary head), ship (held-out greedy acceptance and Gumbel match rate, then the draft "
            "directory and its MANIFEST.json). Each stage checkpoints to --work-dir; rerun to resume. The teacher "
            "answers come from `python -m node.training.teacher` (also resumable)."
        ),
    )
    p.add_argument("--stages", type=_stages, help=f"comma-separated (default {','.join(d['stages'])})")
    p.add_argument("--teacher-dir", type=Path, help=f"teacher answer shards (default {d['teacher_dir']})")
    p.add_argument("--work-dir", type=Path, help=f"labels and checkpoints (default {d['work_dir']})")
    p.add_argument("--out-dir", type=Path, help=f"the shipped draft (default {d['out_dir']})")
    p.add_argument("--layers", type=_int_tuple, help=f"target layers to start from (default {d['layers']})")
    p.add_argument("--sub-vocab", type=int, help=f"head size (default {d['sub_vocab']})")
    p.add_argument("--code-tokens", type=int, help=f"stdlib code tokens to label (default {d['code_tokens']})")
    p.add_argument("--steps", type=int, help=f"optimiser steps in all (default {d['steps']})")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {d['lr']})")
    p.add_argument("--threads", type=int, help=f"torch threads (default {d['threads']})")
    p.add_argument("--config", type=Path, help="TOML file whose [train-draft] table supplies defaults")
    p.set_defaults(func=_cmd_train_draft)


def _cmd_train_draft(args: argparse.Namespace) -> int:
    import torch

    from node.training.distill.labels import label
    from node.training.distill.ship import ship
    from node.training.distill.train import train

    logging.getLogger().setLevel(logging.INFO)
    cfg = DistillConfig(**resolve(args, "train-draft", DistillConfig))
    torch.set_num_threads(cfg.threads)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    stages = {"labels": label, "train": train, "ship": ship}
    for name in cfg.stages:
        result = stages[name](cfg)
        if name == "ship":
            print(json.dumps(result["heldout"], indent=2))
    return 0


def _add_train(sub) -> None:
    d = defaults(PipelineConfig)
    p = sub.add_parser(
        "train",
        help="retrain the shipped tiny tokenizer + target/draft pair (resumable)",
        description=(
            "Train a byte-level BPE tokenizer and a GPT-2-style target/draft pair on this Python's standard "
            "library, distilling the draft from the target. Every stage checkpoints to --work-dir; rerun the "
            "same command to resume after an interruption. --out-dir models replaces the shipped pair."
        ),
    )
    p.add_argument(
        "--out-dir", type=Path, default=d["out_dir"], help=f"model dirs + MANIFEST.json (default {d['out_dir']})"
    )
    p.add_argument("--work-dir", type=Path, default=d["work_dir"], help=f"checkpoints (default {d['work_dir']})")
    for name in ("target_steps", "draft_steps", "batch_size", "threads"):
        p.add_argument(f"--{name.replace('_', '-')}", type=positive_int, default=d[name], help=f"default {d[name]}")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from node.training.pipeline import run

    logging.getLogger().setLevel(logging.INFO)
    names = ("out_dir", "work_dir", "target_steps", "draft_steps", "batch_size", "threads")
    manifest = run(PipelineConfig(**{name: getattr(args, name) for name in names}))
    print(json.dumps({k: manifest[k] for k in ("target", "draft", "greedy_acceptance")}, indent=2))
    return 0
