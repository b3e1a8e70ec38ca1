"""The ship stage of the SmolLM2 draft's distillation: measure it on held-out prompts, then write
the draft directory with its manifest (see ``node.training.distill``)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

import numpy as np

from node.model.kernels import DEFAULT_KERNEL
from node.model.subvocab import DRAFT_RECORD, DRAFT_WEIGHTS, EMBED_KEY
from node.training.distill.config import DistillConfig
from node.training.distill.labels import load_labels, teacher_records
from node.training.distill.train import restore

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
GREEDY_BAR = 0.6  # the bars for the shipped draft
GUMBEL_BAR = 0.5
SPEED_BAR_MS = 3.0
SPEED_PREFIX = 64
SPEED_TOKENS = 40
SPEED_ROUNDS = 5
MS_KERNELS = (DEFAULT_KERNEL, "plain")  # the drafter's kernel, and torch's for comparison


def coupled_tokens(logits: np.ndarray, seed: int, k0: int, temperature: float) -> np.ndarray:
    """Tokens argmax(logits / T + G_k) with the project's Gumbel noise G_k (seed, k = k0 + row):
    how the target samples and how an honest drafter drafts under Rule.GUMBEL."""
    from verifier.noise import gumbel

    rows = np.asarray(logits, dtype=np.float64) / temperature  # [n, V]
    return np.array([int(np.argmax(row + gumbel(seed, k0 + i, len(row)))) for i, row in enumerate(rows)])


def _logits_pair(target, draft, record: dict):
    """Teacher-forced target and draft logits over the answer positions: [n, V] each."""
    import torch

    ids = torch.tensor([record["prompt_ids"] + record["answer_ids"]])
    start = len(record["prompt_ids"])
    with torch.inference_mode():
        t = target(input_ids=ids).logits[0, start - 1 : -1].float().numpy()
        d = draft(input_ids=ids).logits[0, start - 1 : -1].float().numpy()
    return t, d


def evaluate(cfg: DistillConfig, draft) -> dict:
    """Greedy acceptance and Gumbel-coupled match rate per kind on the held-out teacher answers."""
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(cfg.target_dir, dtype=torch.float32).eval()
    heldout = [r for r in teacher_records(cfg.teacher_dir) if r["heldout"] and r["answer_ids"]]
    sums: dict[str, list[int]] = {}
    for record in tqdm(heldout, desc="held-out evaluation", unit="answer"):
        t, d = _logits_pair(target, draft, record)
        s = sums.setdefault(record["kind"], [0, 0, 0, 0, 0])
        s[0] += int((t.argmax(-1) == d.argmax(-1)).sum())
        s[1] += len(t)
        for seed in range(cfg.eval_seeds):
            same = coupled_tokens(t, seed, 0, cfg.eval_temperature) == coupled_tokens(d, seed, 0, cfg.eval_temperature)
            s[2] += int(same.sum())
            s[3] += len(t)
        s[4] += 1
    return {
        kind: {
            "answers": s[4],
            "positions": s[1],
            "greedy_acceptance": round(s[0] / s[1], 4),
            f"gumbel_match_t{cfg.eval_temperature}": round(s[2] / s[3], 4),
        }
        for kind, s in sorted(sums.items())
    }


def draft_ms_per_token(draft, kernel: str) -> list[float]:
    """Median time of one drafted token (one position with a KV cache) on the current threads, with
    the linear-layer kernel ``kernel`` (node.model.kernels; a drafter peer serves with DEFAULT_KERNEL), in
    each of SPEED_ROUNDS rounds, fastest first: the spread is the machine's noise (other tenants'
    memory traffic), and the first figure, as with ``timeit``, the draft's own cost."""
    from node.model.loading import load_kernel

    model = load_kernel(draft, "draft", kernel)
    medians = []
    for _ in range(SPEED_ROUNDS):
        model.reset()
        model.extend(list(range(100, 100 + SPEED_PREFIX)))
        times = []
        for i in range(SPEED_TOKENS):
            started = time.perf_counter()
            model.extend([200 + i])
            times.append(time.perf_counter() - started)
        medians.append(round(1000 * float(np.median(times)), 3))
    return sorted(medians)


def _round_to_stored_dtype(draft) -> None:
    """Round every shipped weight to float16 in place (the embedding is the target's, not shipped):
    the held-out figures and the speed are then those of the shipped draft, whose float16 weights the
    skinny kernel reads as float16."""
    import torch

    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name != EMBED_KEY:
                param.copy_(param.to(torch.float16).float())


def _write_weights(draft, out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    state = {k: v.detach().to(torch.float16).contiguous() for k, v in draft.state_dict().items()}
    state.pop(EMBED_KEY)  # the target's: read from the converted target at load time
    state.pop("lm_head.ids")
    state["head.weight"] = state.pop("lm_head.weight")
    state["head.ids"] = draft.lm_head.ids.clone()
    save_file(state, out / DRAFT_WEIGHTS)


def _data_summary(cfg: DistillConfig, labels: list[dict]) -> dict:
    teacher = [x for x in labels if x["start"] > 1]
    code = [x for x in labels if x["start"] == 1]
    return {
        "teacher_answers": len(teacher),
        "teacher_answer_tokens": int(sum(len(x["top_i"]) for x in teacher)),
        "code_chunks": len(code),
        "code_tokens": int(sum(len(x["top_i"]) for x in code)),
        "top_k": cfg.top_k,
    }


def ship(cfg: DistillConfig) -> dict:
    """Evaluate the trained draft and write ``cfg.out_dir`` (replaced whole, atomically)."""
    from transformers import AutoTokenizer

    from node.model.pairs import check_prepared

    labels = load_labels(cfg.work_dir)  # read once: for the head's sub-vocabulary and the summary
    draft, _, step, sub_ids = restore(cfg, labels)
    draft.eval()
    _round_to_stored_dtype(draft)  # measure exactly the weights that ship
    results = evaluate(cfg, draft)
    ms = {kernel: draft_ms_per_token(draft, kernel) for kernel in MS_KERNELS}
    tmp = cfg.out_dir.with_name(cfg.out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    draft.config.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(cfg.target_dir).save_pretrained(tmp)
    _write_weights(draft, tmp)
    record = {"pair": "smollm2", "target_model_hash": check_prepared(cfg.target_dir)["model_hash"]}
    (tmp / DRAFT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
    trainable = sum(p.numel() for n, p in draft.named_parameters() if n != EMBED_KEY)
    manifest = {
        "target": {"model": "SmolLM2-135M-Instruct", "model_hash": record["target_model_hash"]},
        "draft": {
            "decoder_layers": len(cfg.layers),
            "initialised_from_target_layers": list(cfg.layers),
            "sub_vocab": len(sub_ids),
            "shipped_parameters": trainable,
            "stored_dtype": "float16",
            "embedding": "the target's (not shipped)",
            "ms_per_token_one_thread": ms[DEFAULT_KERNEL][0],
            "ms_per_token_one_thread_by_kernel": {kernel: rounds[0] for kernel, rounds in ms.items()},
            "ms_per_token_rounds_by_kernel": ms,
        },
        "training": {"steps": step, "lr": cfg.lr, "batch_sequences": cfg.batch_sequences, **_data_summary(cfg, labels)},
        "heldout": results,
        "bars": {"greedy_acceptance": GREEDY_BAR, "gumbel_match": GUMBEL_BAR, "ms_per_token": SPEED_BAR_MS},
        "files": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(tmp.iterdir())},
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(cfg.out_dir, ignore_errors=True)
    tmp.rename(cfg.out_dir)
    log.info("shipped the draft to %s: %s", cfg.out_dir, json.dumps(results))
    return manifest
