"""End-to-end, resumable training of the shipped tokenizer + target + draft, with a manifest.

Every stage caches its result in ``work_dir``; rerunning after a crash resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from node.training import corpus
from node.training.config import PipelineConfig
from node.training.loop import (
    DRAFT_SHAPE,
    TARGET_SHAPE,
    TrainConfig,
    build_model,
    heldout_figures,
    train,
)

log = logging.getLogger(__name__)


def _tokenizer(cfg: PipelineConfig, split: corpus.CorpusSplit):
    from transformers import PreTrainedTokenizerFast

    path = cfg.work_dir / "tokenizer"
    if not (path / "tokenizer.json").exists():
        log.info("training byte-level BPE (vocab %d) on %d files", corpus.VOCAB_SIZE, len(split.train))
        corpus.train_tokenizer(split.train).save_pretrained(path)
    return PreTrainedTokenizerFast.from_pretrained(path)


def _tokens(cfg: PipelineConfig, tokenizer, name: str, paths) -> np.ndarray:
    path = cfg.work_dir / f"{name}.npy"
    if not path.exists():
        log.info("encoding %d %s files", len(paths), name)
        np.save(path, corpus.encode_files(tokenizer, paths))
    return np.load(path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_hashes(out_dir: Path) -> dict[str, str]:
    return {
        p.relative_to(out_dir).as_posix(): _sha256(p)
        for p in sorted(out_dir.rglob("*"))
        if p.is_file() and p.name != "MANIFEST.json"
    }


def _save(model, tokenizer, path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)  # each model dir is self-contained


def run(cfg: PipelineConfig) -> dict:
    torch.set_num_threads(cfg.threads)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    split = corpus.split_corpus()
    tokenizer = _tokenizer(cfg, split)
    train_ids = _tokens(cfg, tokenizer, "train", split.train)
    heldout_ids = _tokens(cfg, tokenizer, "heldout", split.heldout)
    eos = tokenizer.eos_token_id
    log.info("corpus: %d train tokens, %d held-out tokens", len(train_ids), len(heldout_ids))

    started = time.time()
    target_cfg = TrainConfig(steps=cfg.target_steps, batch_size=cfg.batch_size)
    target = build_model(TARGET_SHAPE, len(tokenizer), eos)
    train(target, train_ids, target_cfg, cfg.work_dir / "target.ckpt", desc="target")

    draft_cfg = TrainConfig(steps=cfg.draft_steps, batch_size=cfg.batch_size, lr=2e-3, seed=1, distill_weight=0.9)
    draft = build_model(DRAFT_SHAPE, len(tokenizer), eos)
    train(draft, train_ids, draft_cfg, cfg.work_dir / "draft.ckpt", teacher=target, desc="draft (distil)")

    log.info("evaluating on held-out files")
    figures = heldout_figures(target, draft, heldout_ids)
    metrics = {
        "target": {
            "shape": asdict(TARGET_SHAPE),
            "parameters": target.num_parameters(),
            "training_tokens": target_cfg.steps * target_cfg.batch_size * target_cfg.block_size,
            "heldout_loss": round(figures.target_loss, 4),
        },
        "draft": {
            "shape": asdict(DRAFT_SHAPE),
            "parameters": draft.num_parameters(),
            "training_tokens": draft_cfg.steps * draft_cfg.batch_size * draft_cfg.block_size,
            "distilled_from": "target",
            "distill_weight": draft_cfg.distill_weight,
            "heldout_loss": round(figures.draft_loss, 4),
        },
        "greedy_acceptance": round(figures.greedy_acceptance, 4),
    }
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(cfg.out_dir / "tokenizer")
    _save(target, tokenizer, cfg.out_dir / "target")
    _save(draft, tokenizer, cfg.out_dir / "draft")
    manifest = {
        **metrics,
        "parameter_ratio": round(metrics["target"]["parameters"] / metrics["draft"]["parameters"], 2),
        "vocab_size": len(tokenizer),
        "corpus": {
            "source": "python standard library (.py), split by file path hash",
            "python": platform.python_version(),
            "train_files": len(split.train),
            "heldout_files": len(split.heldout),
            "train_tokens": len(train_ids),
            "heldout_tokens": len(heldout_ids),
        },
        "training_seconds_this_run": round(time.time() - started, 1),
        "torch": torch.__version__,
        "argv": sys.argv[1:],
        "files": _file_hashes(cfg.out_dir),
    }
    (cfg.out_dir / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
