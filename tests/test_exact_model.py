"""The served exact model (node/model/exact/model.py on exact.c and ops.c) against the torch
reference (node/model/exact/reference.py), bit for bit: on a seeded qwen2 GGUF with every block
format, and on the first layers of the published target. Whatever the pass width, the tree, the
batch or the ISA path, a row's logits are the same bits."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from exact_models import TOKENIZER_DIR, write_seeded_gguf
from test_exact_recipes import random_blocks

from node.model.exact import ARITHMETIC_VERSION
from node.model.exact.blocks import TYPES, decode, dequantize
from node.model.exact.convert import write_exact
from node.model.exact.kernel import BASE_FLAGS, compiled, library
from node.model.exact.model import ExactLM, load_exact_lm
from node.model.exact.reference import ExactReference, Weight
from node.model.kernels import ISA_ENV
from node.model.kernels.batch import extend_batch
from node.model.loading import ModelLoadError, load_model_dir, model_hash
from node.model.pairs import QWEN_TARGET_DIR

PROMPT = [11, 402, 7, 3051, 99, 1203, 5, 2048, 77]  # 9 tokens of the tiny vocabulary
REAL_PROMPT = [151643, 750, 75698, 1445, 982, 257, 421, 308, 366]  # "<|endoftext|>def fibonacci(n):..."
HEAD_ROWS = 2048  # the real head's rows the reference scores (each logit is its own product)


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("exact")
    gguf = write_seeded_gguf(root / "seeded.gguf")
    return write_exact(gguf, hashlib.sha256(gguf.read_bytes()).hexdigest(), root / "model", TOKENIZER_DIR)


@pytest.fixture(scope="module")
def model(seeded) -> ExactLM:
    lm, _ = load_model_dir(seeded, "target")
    assert isinstance(lm, ExactLM) and lm.arithmetic == ARITHMETIC_VERSION
    return lm


def test_exact_lm_is_the_reference_bit_for_bit_succeeds(seeded, model):
    ref = ExactReference.from_gguf(seeded / "model.gguf")
    lm = model.fork()
    for chunk in (PROMPT[:5], PROMPT[5:6], PROMPT[6:]):  # a prefill, a decode step, a verification pass
        assert np.array_equal(bits(lm.extend(chunk)), bits(ref.extend(chunk).numpy()))


def test_a_row_is_the_same_bits_at_every_pass_width_succeeds(model):
    whole = model.fork().extend(PROMPT)
    one_by_one = model.fork()
    rows = np.concatenate([one_by_one.extend([t]) for t in PROMPT])
    assert np.array_equal(bits(whole), bits(rows))
    split = model.fork()
    rows = np.concatenate([split.extend(PROMPT[:2]), split.extend(PROMPT[2:9])])
    assert np.array_equal(bits(whole), bits(rows))


def test_tree_rows_are_their_chains_bit_for_bit_succeeds(model):
    lm = model.fork()
    lm.extend(PROMPT[:4])
    # root 0 with two children (1, 2); 3 under 2
    tokens, parents = [PROMPT[4], PROMPT[5], 901, PROMPT[6]], [-1, 0, 0, 2]
    tree = lm.extend_tree(tokens, parents)
    for path in ([0, 1], [0, 2, 3]):
        chain = model.fork()
        chain.extend(PROMPT[:4])
        want = chain.extend([tokens[r] for r in path])
        assert np.array_equal(bits(tree[path]), bits(want))


def test_a_batched_pass_is_each_job_alone_succeeds(model):
    jobs = [model.fork(), model.fork()]
    jobs[0].extend(PROMPT[:3])
    jobs[1].extend(PROMPT[2:8])
    shared = extend_batch(jobs, [PROMPT[3:6], [PROMPT[8]]])
    alone = [model.fork(), model.fork()]
    alone[0].extend(PROMPT[:3])
    alone[1].extend(PROMPT[2:8])
    assert np.array_equal(bits(shared[0]), bits(alone[0].extend(PROMPT[3:6])))
    assert np.array_equal(bits(shared[1]), bits(alone[1].extend([PROMPT[8]])))


def test_the_avx2_path_is_the_vnni_path_bit_for_bit_succeeds(model, monkeypatch):
    fast = model.fork().extend(PROMPT)
    monkeypatch.setenv(ISA_ENV, "avx2")
    assert np.array_equal(bits(fast), bits(model.fork().extend(PROMPT)))


def test_long_contexts_are_the_reference_bit_for_bit_succeeds(seeded, model):
    """Past 16 keys attention scores keys 16 at a time (ops.c's AVX-512 fold): the same bits."""
    prompt = [(t * 7 + i) % 4096 for i, t in enumerate(PROMPT * 6)]  # 54 tokens
    ref, lm = ExactReference.from_gguf(seeded / "model.gguf"), model.fork()
    for chunk in (prompt[:37], prompt[37:38], prompt[38:]):
        assert np.array_equal(bits(lm.extend(chunk)), bits(ref.extend(chunk).numpy()))


def test_the_avx2_only_build_is_the_served_build_bit_for_bit_succeeds(seeded, model):
    """The kernel compiled without AVX-512 (scalar folds, AVX2 products) computes the same bits."""
    cfg = json.loads((seeded / "config.json").read_text())
    narrow = load_exact_lm(seeded, cfg, "target", compiled(BASE_FLAGS))
    prompt = [(t * 5 + i) % 4096 for i, t in enumerate(PROMPT * 4)]
    assert np.array_equal(bits(narrow.extend(prompt)), bits(model.fork().extend(prompt)))


def test_a_prefix_copy_is_the_prefill_bit_for_bit_succeeds(model):
    lm = model.fork()
    lm.extend(PROMPT[:6])
    copy = lm.fork_with_prefix(4)
    fresh = model.fork()
    fresh.extend(PROMPT[:4])
    assert np.array_equal(bits(copy.extend(PROMPT[4:])), bits(fresh.extend(PROMPT[4:])))


def test_the_model_hash_names_the_published_file_and_the_arithmetic_succeeds(seeded, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(seeded, other)
    assert model_hash(other) == model_hash(seeded)
    cfg = json.loads((other / "config.json").read_text())
    cfg["arithmetic"] = "specmarket-exact/0"
    (other / "config.json").write_text(json.dumps(cfg))
    assert model_hash(other) != model_hash(seeded)
    with pytest.raises(ModelLoadError, match="specmarket-exact/0"):
        load_model_dir(other, "target")
    shutil.copytree(seeded, tmp_path / "flipped")
    gguf = tmp_path / "flipped" / "model.gguf"
    data = bytearray(gguf.read_bytes())
    data[-1] ^= 1  # one bit of the head's last block
    gguf.write_bytes(bytes(data))
    assert model_hash(tmp_path / "flipped") != model_hash(seeded)


@pytest.mark.skipif(not QWEN_TARGET_DIR.is_dir(), reason="the exact target is made by `make setup`")
def test_the_real_targets_first_layers_are_the_reference_bit_for_bit_succeeds():
    layers = 2
    cfg = json.loads((QWEN_TARGET_DIR / "config.json").read_text())
    lm = load_exact_lm(QWEN_TARGET_DIR, {**cfg, "num_hidden_layers": layers}, "target", library())
    ref = ExactReference.from_gguf(QWEN_TARGET_DIR / "model.gguf", layers=layers, positions=64)
    head = ref.w["output.weight"]
    ref.w["output.weight"] = Weight(head.kind, head.data[:HEAD_ROWS], head.k)
    with torch.inference_mode():
        for chunk in (REAL_PROMPT[:6], REAL_PROMPT[6:]):
            got = lm.extend(chunk)[:, :HEAD_ROWS]
            assert np.array_equal(bits(got), bits(ref.extend(chunk).numpy()))


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_the_embedding_rows_are_the_reference_dequantization_succeeds(name):
    """ops.c's ex_embed (the served embedding of a K-quant table) against blocks.py's §10 formulas, bit
    for bit, on random blocks; an id outside the table is refused."""
    lib, kind, rng = library(), TYPES[name], np.random.default_rng(21)
    n, k = 40, 512
    raw = random_blocks(kind, n, k, rng)
    ids = torch.tensor([0, 39, 7, 7, 23], dtype=torch.int64)
    out = torch.empty(len(ids), k)
    code = {"Q4_K": 2, "Q6_K": 3}[name]
    assert lib.ex_embed(code, raw.ctypes.data, n, k, ids.data_ptr(), len(ids), out.data_ptr()) == 0
    want = dequantize(decode(torch.from_numpy(np.ascontiguousarray(raw[ids.numpy()])), kind, k))
    assert np.array_equal(bits(out), bits(want))
    bad = torch.tensor([3, n], dtype=torch.int64)
    assert lib.ex_embed(code, raw.ctypes.data, n, k, bad.data_ptr(), 2, out.data_ptr()) == 2
