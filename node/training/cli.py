"""Command line for the resumable training pipeline (``scripts/train_models.py``)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from node.training.pipeline import PipelineConfig, run

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "models"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_models",
        description=(
            "Train a byte-level BPE tokenizer and a GPT-2-style target/draft pair on this Python's "
            "standard library, distilling the draft from the target. Every stage checkpoints to "
            "--work-dir; rerun the same command to resume after an interruption."
        ),
    )
    p.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="where the HF model dirs and MANIFEST.json go")
    p.add_argument("--work-dir", type=Path, default=Path(".cache/train"), help="checkpoints and token caches")
    p.add_argument("--target-steps", type=int, default=PipelineConfig.target_steps)
    p.add_argument("--draft-steps", type=int, default=PipelineConfig.draft_steps)
    p.add_argument("--batch-size", type=int, default=PipelineConfig.batch_size)
    p.add_argument("--threads", type=int, default=PipelineConfig.threads)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for name in ("target_steps", "draft_steps", "batch_size", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1")
    cfg = PipelineConfig(
        out_dir=args.out_dir,
        work_dir=args.work_dir,
        target_steps=args.target_steps,
        draft_steps=args.draft_steps,
        batch_size=args.batch_size,
        threads=args.threads,
    )
    manifest = run(cfg)
    print(json.dumps({k: manifest[k] for k in ("target", "draft", "greedy_acceptance")}, indent=2))
    return 0
