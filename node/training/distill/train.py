"""The train stage of the SmolLM2 draft's distillation (see ``node.training.distill``)."""

from __future__ import annotations

import logging
import math
import random
import time

import numpy as np

from node.training.distill.config import DistillConfig
from node.training.distill.labels import DistillError, frequency_ranked_ids, load_labels, save_atomic

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
SUBVOCAB = "subvocab.npy"


def build_draft(cfg: DistillConfig, sub_ids: np.ndarray):
    """The untrained draft: the target's embedding (frozen), its decoder layers ``cfg.layers`` and
    final norm as the starting point, and a head over ``sub_ids`` initialised from the (tied)
    embedding rows, so step 0 is the target's early exit."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from node.model.subvocab import make_head

    target = AutoModelForCausalLM.from_pretrained(cfg.target_dir, dtype=torch.float32)
    config = LlamaConfig(**{**target.config.to_dict(), "num_hidden_layers": len(cfg.layers)})
    config.tie_word_embeddings = False
    draft = LlamaForCausalLM(config)
    draft.model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    draft.model.embed_tokens.weight.requires_grad_(False)
    for mine, theirs in zip(draft.model.layers, cfg.layers, strict=True):
        mine.load_state_dict(target.model.layers[theirs].state_dict())
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    ids = torch.as_tensor(sub_ids)
    draft.lm_head = make_head(ids, target.model.embed_tokens.weight.data[ids].clone(), config.vocab_size)
    return draft


def _sub_logits(draft, ids, start: int):  # -> [n, S]: the head's scores over the sub-vocabulary only
    hidden = draft.model(input_ids=ids[None]).last_hidden_state[0, start - 1 : len(ids) - 1]
    return hidden @ draft.lm_head.weight.T


def kd_loss(draft, item: dict, full_to_sub):
    """Cross-entropy to the target's top-k distribution, restricted to the sub-vocabulary and
    renormalised there (mass outside it cannot be drafted anyway)."""
    import torch

    ids = torch.as_tensor(item["ids"], dtype=torch.long)
    logq = torch.log_softmax(_sub_logits(draft, ids, item["start"]), -1)  # [n, S]
    top_sub = full_to_sub[torch.as_tensor(item["top_i"], dtype=torch.long)]  # [n, K], -1 outside
    inside = top_sub >= 0
    target_p = torch.as_tensor(item["top_v"], dtype=torch.float32).exp() * inside
    target_p = target_p / target_p.sum(-1, keepdim=True).clamp_min(1e-9)
    return -(target_p * logq.gather(1, top_sub.clamp_min(0))).sum(-1).mean()


def _lr(cfg: DistillConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def restore(cfg: DistillConfig, labels: list[dict]):
    import torch

    sub_path = cfg.work_dir / SUBVOCAB
    if not sub_path.exists():  # fixed at the first start, so a resumed run trains the same head
        from transformers import AutoConfig

        eos = int(AutoConfig.from_pretrained(cfg.target_dir).eos_token_id)  # always draftable: answers end with it
        np.save(sub_path, frequency_ranked_ids(labels, cfg.sub_vocab, always=(eos,)))
    sub_ids = np.load(sub_path)
    draft = build_draft(cfg, sub_ids)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    step = 0
    ckpt = cfg.work_dir / CHECKPOINT
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        draft.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        log.info("resuming the draft's training at step %d", step)
    return draft, opt, step, sub_ids


def train(cfg: DistillConfig) -> None:
    import torch
    from tqdm import tqdm

    torch.manual_seed(cfg.seed)
    labels = load_labels(cfg.work_dir)
    if not labels:
        raise DistillError(f"no label shards in {cfg.work_dir}: run the labels stage first")
    draft, opt, step, sub_ids = restore(cfg, labels)
    full_to_sub = torch.full((draft.config.vocab_size,), -1, dtype=torch.long)
    full_to_sub[torch.as_tensor(sub_ids)] = torch.arange(len(sub_ids))
    order = random.Random(cfg.seed * 1_000_003 + step)  # a resumed run does not replay its first batches
    bar = tqdm(total=cfg.steps, initial=step, desc="draft training", unit="step")
    recent: list[float] = []
    started = time.perf_counter()
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = _lr(cfg, step)
        loss = sum(kd_loss(draft, item, full_to_sub) for item in order.choices(labels, k=cfg.batch_sequences))
        (loss / cfg.batch_sequences).backward()
        torch.nn.utils.clip_grad_norm_([p for p in draft.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        recent = [*recent[-49:], loss.item() / cfg.batch_sequences]
        bar.update()
        bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_atomic({"model": draft.state_dict(), "opt": opt.state_dict(), "step": step}, cfg.work_dir / CHECKPOINT)
    bar.close()
    log.info("trained to step %d (%.0f s this run)", step, time.perf_counter() - started)
