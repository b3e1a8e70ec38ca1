"""The shipped pair: manifest bars, checksums, re-measured numbers, and pairing errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from node.model.loading import ModelLoadError, load_pair
from node.model.pairs import MODELS_DIR
from node.training.corpus import encode_files, split_corpus
from node.training.loop import heldout_figures
from verifier.errors import ModelMismatch

pytestmark = pytest.mark.slow(seconds=30)  # scheduled first (tests/conftest.py)

MANIFEST = json.loads((MODELS_DIR / "MANIFEST.json").read_text())
SIZE_CAP_BYTES = 60 * 1024 * 1024
REPRODUCE_TOLERANCE = 1e-3  # same data, same code, same software: only float reduction order may differ


def test_manifest_bars_hold():
    assert MANIFEST["target"]["heldout_loss"] < MANIFEST["draft"]["heldout_loss"]
    assert MANIFEST["target"]["parameters"] >= 4 * MANIFEST["draft"]["parameters"]
    assert MANIFEST["greedy_acceptance"] >= 0.55
    assert MANIFEST["draft"]["distilled_from"] == "target"


def test_shipped_files_match_manifest_checksums_and_size_cap():
    files = MANIFEST["files"]
    assert {"target/model.safetensors", "draft/model.safetensors", "tokenizer/tokenizer.json"} <= set(files)
    total = 0
    for rel, digest in files.items():
        data = (MODELS_DIR / rel).read_bytes()
        total += len(data)
        assert hashlib.sha256(data).hexdigest() == digest, f"{rel} changed since training"
    assert total <= SIZE_CAP_BYTES


def test_parameter_counts_match_loaded_models(pair):
    assert pair.target.model.num_parameters() == MANIFEST["target"]["parameters"]
    assert pair.draft.model.num_parameters() == MANIFEST["draft"]["parameters"]
    assert pair.target.vocab_size == pair.draft.vocab_size == MANIFEST["vocab_size"]


def test_heldout_numbers_are_reproducible(pair):
    """Re-measure exactly as the pipeline did, on the held-out files (never trained on): the
    manifest's figures are measurements, not hand-written numbers."""
    heldout = encode_files(pair.tokenizer, split_corpus().heldout)
    assert len(heldout) == MANIFEST["corpus"]["heldout_tokens"]
    figures = heldout_figures(pair.target.model, pair.draft.model, heldout)
    assert abs(figures.target_loss - MANIFEST["target"]["heldout_loss"]) < REPRODUCE_TOLERANCE
    assert abs(figures.draft_loss - MANIFEST["draft"]["heldout_loss"]) < REPRODUCE_TOLERANCE
    assert abs(figures.greedy_acceptance - MANIFEST["greedy_acceptance"]) < REPRODUCE_TOLERANCE


def _tiny_model_dir(path: Path, vocab_size: int, tokenizer) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=16, n_layer=1, n_head=1)).save_pretrained(
        path
    )
    tokenizer.save_pretrained(path)
    return path


def test_vocabulary_mismatch_is_a_clear_error(tmp_path, pair):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    other = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    bad = _tiny_model_dir(tmp_path / "other_vocab", len(other), other)
    with pytest.raises(ModelMismatch, match="does not share the target's vocabulary"):
        load_pair(MODELS_DIR / "target", bad)
    resized = _tiny_model_dir(tmp_path / "resized", 5000, pair.tokenizer)  # same tokenizer, other size
    with pytest.raises(ModelMismatch):
        load_pair(MODELS_DIR / "target", resized)


def test_other_compatible_pair_loads(tmp_path, pair):
    compatible = _tiny_model_dir(tmp_path / "tiny", pair.target.vocab_size, pair.tokenizer)
    loaded = load_pair(MODELS_DIR / "target", compatible)
    assert loaded.draft.vocab_size == pair.target.vocab_size
    logits = loaded.draft.extend([1, 2, 3])
    assert logits.shape == (3, pair.target.vocab_size) and np.all(np.isfinite(logits))


def test_missing_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        load_pair(tmp_path / "nowhere", None)
