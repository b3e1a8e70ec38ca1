"""The SmolLM2 draft's distillation on a few sequences: labels resume without redoing work, training
resumes at its checkpoint, and the shipped directory loads as a draft that scores only its
sub-vocabulary and is refused beside another target."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from node.model.loading import load_model_dir
from node.model.pairs import SMOLLM2_TARGET_DIR
from node.model.subvocab import DRAFT_RECORD, FILL_LOGIT
from node.training.distill.config import DistillConfig
from node.training.distill.labels import frequency_ranked_ids, label, load_labels
from node.training.distill.ship import ship
from node.training.distill.train import CHECKPOINT, train
from verifier.errors import SpecmarketError


def _records(tokenizer, n: int, heldout: bool) -> list[dict]:
    out = []
    for i in range(n):
        prompt = tokenizer.encode(f"Question {i}: what is {i} plus {i}?")
        answer = [*tokenizer.encode(f"The answer is {2 * i}."), tokenizer.eos_token_id]
        kind = "code" if i % 2 else "chat"
        out.append({"kind": kind, "heldout": heldout, "prompt_ids": prompt, "answer_ids": answer})
    return out


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from transformers import AutoTokenizer

    base = tmp_path_factory.mktemp("distill")
    tokenizer = AutoTokenizer.from_pretrained(SMOLLM2_TARGET_DIR)
    teacher = base / "teacher"
    teacher.mkdir()
    _write(teacher / "shard-00000.jsonl", _records(tokenizer, 3, False) + _records(tokenizer, 2, True))
    cfg = DistillConfig(
        teacher_dir=teacher,
        work_dir=base / "work",
        out_dir=base / "draft",
        layers=(0,),
        sub_vocab=512,
        code_tokens=128,
        chunk=64,
        steps=2,
        checkpoint_every=1,
        eval_seeds=1,
    )
    cfg.work_dir.mkdir()
    label(cfg)
    return cfg, tokenizer


def test_labels_cover_the_answers_and_resume_without_redoing_work(run):
    cfg, tokenizer = run
    labels = load_labels(cfg.work_dir)
    teacher = [x for x in labels if x["start"] > 1]
    assert len(teacher) == 3  # held-out answers are never labelled for training
    assert sum(1 for x in labels if x["start"] == 1) == 2  # 128 code tokens in 64-token chunks
    first = teacher[0]
    assert first["top_i"].shape == (len(first["ids"]) - first["start"], cfg.top_k)
    assert np.all(np.diff(first["top_v"].astype(np.float32), axis=1) <= 0)  # log-probs, best first
    shards = sorted(p.name for p in cfg.work_dir.glob("*.pt"))
    label(cfg)  # nothing new: nothing written
    assert sorted(p.name for p in cfg.work_dir.glob("*.pt")) == shards
    more = cfg.teacher_dir / "shard-00001.jsonl"
    _write(more, _records(tokenizer, 1, False))
    label(cfg)  # one new answer: one new shard with only it
    assert len([x for x in load_labels(cfg.work_dir) if x["start"] > 1]) == 4
    more.unlink()


def test_training_resumes_at_its_checkpoint_and_ships_a_loadable_draft(run):
    import torch

    cfg, _ = run
    train(cfg)
    assert torch.load(cfg.work_dir / CHECKPOINT, weights_only=False)["step"] == 2
    resumed = replace(cfg, steps=3)
    train(resumed)
    assert torch.load(cfg.work_dir / CHECKPOINT, weights_only=False)["step"] == 3
    manifest = ship(resumed)
    assert manifest["training"]["steps"] == 3
    assert set(manifest["heldout"]) == {"chat", "code"}
    for kind in manifest["heldout"].values():
        assert 0.0 <= kind["greedy_acceptance"] <= 1.0 and kind["positions"] > 0
    draft, _ = load_model_dir(cfg.out_dir, "draft")
    logits = draft.extend([1, 2, 3])  # [3, V]
    sub = draft.model.lm_head.ids.numpy()
    outside = np.setdiff1d(np.arange(logits.shape[1]), sub)
    assert logits.shape == (3, 49152)
    assert np.all(logits[:, outside] == FILL_LOGIT)
    assert np.all(logits[:, sub] > FILL_LOGIT)


def test_a_draft_trained_for_another_target_is_refused(run, tmp_path):
    import shutil

    cfg, _ = run
    if not (cfg.out_dir / DRAFT_RECORD).exists():
        pytest.fail("the shipping test must run first (it ships the draft this test edits)")
    copy = tmp_path / "draft"
    shutil.copytree(cfg.out_dir, copy)
    record = json.loads((copy / DRAFT_RECORD).read_text())
    (copy / DRAFT_RECORD).write_text(json.dumps({**record, "target_model_hash": "ab" * 32}))
    with pytest.raises(SpecmarketError, match="was trained for target 0xabab"):
        load_model_dir(copy, "draft")


def test_the_sub_vocabulary_is_frequency_ranked():
    labels = [
        {"ids": np.array([9, 5, 5, 7]), "start": 1, "top_i": np.array([[5, 1], [5, 2], [7, 3]])},
    ]
    # counts: 5 -> 2 (top-1) + 2 (data) = 4; 7 -> 1 + 1 = 2; 9 only before start: not counted
    assert frequency_ranked_ids(labels, 2, always=(0,)).tolist() == [0, 5]
    assert frequency_ranked_ids(labels, 3, always=(0,)).tolist() == [0, 5, 7]
    assert frequency_ranked_ids(labels, 2, always=(5,)).tolist() == [5, 7]  # a forced token already ranked
