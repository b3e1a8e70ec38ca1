"""The served exact model on the AMX path (node/model/exact/exact_amx.c) against the torch reference
and against the VNNI path, bit for bit, on the seeded qwen2 GGUF with every block format: a prefill
wide enough for AMX (and SPECMARKET_KERNEL_ISA=amx forcing it at every width), decode steps, and a
pass split at other widths. Skipped, with the reason, where the CPU or Linux offers no tiles."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from exact_models import TOKENIZER_DIR, write_seeded_gguf

from node.model.exact import kernel
from node.model.exact.convert import write_exact
from node.model.exact.reference import ExactReference
from node.model.kernels import ISA_ENV
from node.model.loading import load_model_dir

PROMPT = [(7 * i + 11) % 4096 for i in range(40)]  # 40 tokens: past AMX_MIN_ROWS for Q4_K and Q6_K


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact_amx")
    gguf = write_seeded_gguf(root / "seeded.gguf")
    directory = write_exact(gguf, hashlib.sha256(gguf.read_bytes()).hexdigest(), root / "model", TOKENIZER_DIR)
    lm, _ = load_model_dir(directory, "target")
    if not kernel.has_amx(lm._lib):
        pytest.skip("no AMX here (the CPU lacks amx_tile/amx_int8, or Linux refused the tile state)")
    return directory, lm


def test_wide_passes_on_amx_are_the_reference_bit_for_bit_succeeds(model):
    directory, lm = model
    ref, amx = ExactReference.from_gguf(directory / "model.gguf"), lm.fork()
    for chunk in (PROMPT[:33], PROMPT[33:34], PROMPT[34:]):  # AMX (two groups), then VNNI widths
        assert np.array_equal(bits(amx.extend(chunk)), bits(ref.extend(chunk).numpy()))


@pytest.mark.parametrize("isa", ["amx", "vnni"])
def test_every_width_on_each_path_is_the_same_bits_succeeds(model, monkeypatch, isa):
    _, lm = model
    whole = lm.fork().extend(PROMPT)  # AMX from AMX_MIN_ROWS rows, VNNI below
    monkeypatch.setenv(ISA_ENV, isa)  # AMX at every width, or never
    split = lm.fork()
    rows = np.concatenate([split.extend(PROMPT[:17]), split.extend(PROMPT[17:18]), split.extend(PROMPT[18:])])
    assert np.array_equal(bits(whole), bits(rows))
