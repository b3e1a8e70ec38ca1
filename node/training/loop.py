"""Resumable training of the target LM and distillation of the draft LM from it.

Distillation follows DistillSpec (Zhou et al. 2023, "DistillSpec: Improving Speculative Decoding
via Knowledge Distillation"): the draft is trained on the target's own next-token distributions
(forward KL), which is what raises the draft/target acceptance rate.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

log = logging.getLogger(__name__)

WARMUP_STEPS = 100
MIN_LR_FRACTION = 0.1
CHECKPOINT_EVERY = 50


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_embd: int
    n_head: int


TARGET_SHAPE = ModelShape(n_layer=6, n_embd=256, n_head=4)
DRAFT_SHAPE = ModelShape(n_layer=1, n_embd=192, n_head=3)
N_POSITIONS = 512


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 8
    block_size: int = N_POSITIONS
    lr: float = 1e-3
    weight_decay: float = 0.1
    seed: int = 0
    distill_weight: float = 0.0  # 0 = plain next-token CE; 1 = pure forward KL to the teacher


def build_model(shape: ModelShape, vocab_size: int, eos_id: int):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=N_POSITIONS,
        n_embd=shape.n_embd,
        n_layer=shape.n_layer,
        n_head=shape.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < WARMUP_STEPS:
        return cfg.lr * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, cfg.steps - WARMUP_STEPS)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * cosine)


def _batch(data: np.ndarray, cfg: TrainConfig, step: int) -> torch.Tensor:
    """Random windows, reproducible from (seed, step) so a resumed run sees the same batches."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(data) - cfg.block_size - 1, size=cfg.batch_size)
    rows = [data[s : s + cfg.block_size + 1].astype(np.int64) for s in starts]
    return torch.from_numpy(np.stack(rows))


def _loss(model, batch: torch.Tensor, teacher, distill_weight: float) -> torch.Tensor:
    inputs, labels = batch[:, :-1], batch[:, 1:]
    logits = model(input_ids=inputs).logits  # [B, T, V]
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    if teacher is None or distill_weight == 0.0:
        return ce
    with torch.no_grad():
        teacher_logp = F.log_softmax(teacher(input_ids=inputs).logits, dim=-1)
    draft_logp = F.log_softmax(logits, dim=-1)
    kl = F.kl_div(draft_logp, teacher_logp, log_target=True, reduction="none").sum(-1).mean()
    return distill_weight * kl + (1 - distill_weight) * ce


def _save_checkpoint(path: Path, model, optimizer, step: int) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)  # atomic: a crash never leaves a torn checkpoint


def train(model, data: np.ndarray, cfg: TrainConfig, ckpt: Path, *, teacher=None, desc: str = "train"):
    """Train ``model`` in place for ``cfg.steps`` steps, resuming from ``ckpt`` if it exists."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95))
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])
        start = state["step"]
        log.info("%s: resuming from step %d", desc, start)
    if teacher is not None:
        teacher.eval()
    model.train()
    bar = tqdm(range(start, cfg.steps), desc=desc, initial=start, total=cfg.steps, unit="step")
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, cfg)
        loss = _loss(model, _batch(data, cfg, step), teacher, cfg.distill_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if (step + 1) % CHECKPOINT_EVERY == 0 or step + 1 == cfg.steps:
            _save_checkpoint(ckpt, model, optimizer, step + 1)
    model.eval()
    return model


def _eval_windows(data: np.ndarray, max_tokens: int, block: int) -> list[torch.Tensor]:
    n = min(len(data) - 1, max_tokens)
    return [torch.from_numpy(data[s : s + block + 1].astype(np.int64))[None] for s in range(0, n - block, block)]


LOSS_TOKENS = 200_000  # held-out tokens the losses are measured on (the first ones)
ACCEPTANCE_TOKENS = 100_000  # and the greedy acceptance


@dataclass(frozen=True)
class HeldoutFigures:
    target_loss: float  # mean next-token cross-entropy (nats)
    draft_loss: float
    greedy_acceptance: float  # fraction of positions where draft argmax == target argmax (teacher forced)


@torch.no_grad()
def heldout_figures(target, draft, data: np.ndarray, block: int = N_POSITIONS) -> HeldoutFigures:
    """The manifest's held-out figures over non-overlapping windows: each model scores each window
    once, for its loss (the first LOSS_TOKENS) and the acceptance (the first ACCEPTANCE_TOKENS)."""
    windows = _eval_windows(data, LOSS_TOKENS, block)
    agreeing = len(_eval_windows(data, ACCEPTANCE_TOKENS, block))  # a prefix of ``windows``
    loss = {"target": 0.0, "draft": 0.0}
    positions = agree = compared = 0
    for i, window in enumerate(windows):
        inputs, labels = window[:, :-1], window[0, 1:]
        target_logits, draft_logits = target(input_ids=inputs).logits, draft(input_ids=inputs).logits
        loss["target"] += F.cross_entropy(target_logits[0], labels, reduction="sum").item()
        loss["draft"] += F.cross_entropy(draft_logits[0], labels, reduction="sum").item()
        positions += window.shape[1] - 1
        if i < agreeing:
            agree += int((target_logits.argmax(-1) == draft_logits.argmax(-1)).sum())
            compared += inputs.numel()
    return HeldoutFigures(
        loss["target"] / max(1, positions), loss["draft"] / max(1, positions), agree / max(1, compared)
    )
