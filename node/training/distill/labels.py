"""The labels stage of the SmolLM2 draft's distillation (see ``node.training.distill``), and what
every stage shares: the teacher records, the label shards, atomic saves and the stages' error."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from node.training.distill.config import DistillConfig
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)


class DistillError(SpecmarketError):
    """A stage started without what it needs (labels, a checkpoint, teacher answers)."""


SHARD_SEQUENCES = 64


def save_atomic(obj, path: Path) -> None:
    import torch

    tmp = path.with_name(path.name + ".partial")
    torch.save(obj, tmp)
    os.replace(tmp, path)  # a crash mid-write leaves the previous file intact


def teacher_records(teacher_dir: Path) -> Iterator[dict]:
    """Complete JSON lines of the teacher shards, in prompt order."""
    for shard in sorted(Path(teacher_dir).glob("shard-*.jsonl")):
        with shard.open() as f:
            for line in f:
                if line.endswith("\n"):
                    yield json.loads(line)


def code_sequences(tokenizer, chunk: int, max_tokens: int) -> Iterator[list[int]]:
    """Raw stdlib code in ``chunk``-token pieces from training-split files that no held-out code
    prompt was made from (so held-out prompts never leak into training)."""
    from node.training.corpus import read_texts, split_corpus
    from node.training.teacher import heldout_sources

    excluded = heldout_sources()
    files = tuple(p for p in split_corpus().train if p not in excluded)
    buffer: list[int] = []
    produced = 0
    for text in read_texts(files):
        buffer.extend([*tokenizer.encode(text), tokenizer.eos_token_id])
        while len(buffer) >= chunk and produced < max_tokens:
            yield buffer[:chunk]
            buffer = buffer[chunk:]
            produced += chunk
        if produced >= max_tokens:
            return


def _label(model, ids: list[int], start: int, top_k: int) -> dict:
    """Target top-k log-probs for predicting ids[start:] (positions start-1 .. len-2)."""
    import torch

    with torch.inference_mode():
        hidden = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0, start - 1 : len(ids) - 1]
        logprobs = torch.log_softmax(model.lm_head(hidden).float(), -1)  # [n, V]
        values, index = logprobs.topk(top_k, -1)
    return {
        "ids": np.asarray(ids, np.int32),
        "start": start,
        "top_i": index.int().numpy(),
        "top_v": values.half().numpy(),
    }


def _done(cfg: DistillConfig, name: str) -> tuple[int, int]:
    """(shards, sequences) already labelled in stream ``name``."""
    import torch

    shards = sorted(cfg.work_dir.glob(f"{name}-*.pt"))
    return len(shards), sum(len(torch.load(p, weights_only=False)) for p in shards)


def _label_stream(cfg: DistillConfig, name: str, sequences: Iterator[tuple[list[int], int]], model) -> int:
    """Write label shards ``name-NNNNN.pt`` for ``sequences`` (ids, loss start), resuming after the
    sequences already labelled (both streams only ever grow at the end); returns the total."""
    from tqdm import tqdm

    shards, skip = _done(cfg, name)
    shard: list[dict] = []
    count = skip
    bar = tqdm(desc=f"labels ({name})", unit="seq", initial=skip)

    def flush() -> None:
        nonlocal shards, shard
        if shard:
            save_atomic(shard, cfg.work_dir / f"{name}-{shards:05d}.pt")
            shards, shard = shards + 1, []

    for i, (ids, start) in enumerate(sequences):
        if i < skip:
            continue
        shard.append(_label(model, ids, start, cfg.top_k))
        count += 1
        bar.update()
        if len(shard) == SHARD_SEQUENCES:
            flush()
    flush()
    bar.close()
    return count


def label(cfg: DistillConfig) -> None:
    from node.model.loading import load_model_dir

    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    wrapped, tokenizer = load_model_dir(cfg.target_dir, "target")
    model = wrapped.model
    teacher = (
        (r["prompt_ids"] + r["answer_ids"], len(r["prompt_ids"]))
        for r in teacher_records(cfg.teacher_dir)
        if not r["heldout"] and r["answer_ids"]
    )
    n_teacher = _label_stream(cfg, "teacher", teacher, model)
    code = ((ids, 1) for ids in code_sequences(tokenizer, cfg.chunk, cfg.code_tokens))
    n_code = _label_stream(cfg, "code", code, model)
    log.info("labelled %d teacher answers and %d code chunks", n_teacher, n_code)


def load_labels(work_dir: Path) -> list[dict]:
    import torch

    out: list[dict] = []
    for path in sorted(Path(work_dir).glob("*-[0-9]*.pt")):
        out.extend(torch.load(path, weights_only=False))
    return out


def frequency_ranked_ids(labels: list[dict], size: int, always: tuple[int, ...]) -> np.ndarray:
    """FR-Spec's sub-vocabulary: the ``size`` tokens the target ranks first most often in the
    labelled data (plus ``always``, e.g. end-of-text), as sorted ids."""
    counts: dict[int, int] = {}
    for item in labels:
        for token in item["top_i"][:, 0].tolist():
            counts[token] = counts.get(token, 0) + 1
        for token in item["ids"][item["start"] :].tolist():
            counts[token] = counts.get(token, 0) + 1
    chosen = set(always)
    for token in sorted(counts, key=lambda t: (-counts[t], t)):
        if len(chosen) >= size:
            break
        chosen.add(token)
    return np.asarray(sorted(chosen), dtype=np.int64)
