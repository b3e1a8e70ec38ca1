"""The packed K-quant matrices kept in one file beside the model (node/model/exact/packed_store.py):
written once, mapped read-only and shared by every process that loads the model, and checked against
the GGUF's own blocks at every load, so that a corrupted, truncated or stale file is packed again
and never computed with. On a seeded qwen2 GGUF with Q4_K and Q6_K matrices, against the torch
reference, bit for bit."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from exact_models import TOKENIZER_DIR, write_seeded_gguf

from node.model.exact.convert import write_exact
from node.model.exact.kernel import has_vnni
from node.model.exact.packed_store import PREFIX, SUFFIX, store_dir
from node.model.exact.reference import ExactReference
from node.model.loading import load_model_dir, model_hash

PROMPT = [11, 402, 7, 3051, 99, 1203, 5, 2048, 77]

pytestmark = pytest.mark.skipif(not has_vnni(), reason="only the AVX-512 VNNI and AMX paths read packed matrices")


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packed")
    gguf = write_seeded_gguf(root / "seeded.gguf")
    return write_exact(gguf, hashlib.sha256(gguf.read_bytes()).hexdigest(), root / "model", TOKENIZER_DIR)


@pytest.fixture(scope="module")
def expected(seeded) -> np.ndarray:
    return bits(ExactReference.from_gguf(seeded / "model.gguf").extend(PROMPT).numpy())


def packed_files(model: Path) -> list[Path]:
    return sorted(store_dir(model).glob(f"{PREFIX}*{SUFFIX}"))


def logits(directory: Path) -> np.ndarray:
    lm, _ = load_model_dir(directory, "target")
    return bits(lm.fork().extend(PROMPT))


def mapped_shared(path: Path) -> bool:
    """Whether this process maps ``path`` shared (the 's' of /proc/self/maps' permissions)."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return any(line.endswith(str(path)) and line.split()[1][3] == "s" for line in lines)


def test_the_packed_file_is_written_once_then_mapped_shared_and_gives_the_reference_bits(seeded, expected, tmp_path):
    model = shutil.copytree(seeded, tmp_path / "model")
    commitment = model_hash(model)
    assert np.array_equal(logits(model), expected)
    (packed,) = packed_files(model)
    assert model_hash(model) == commitment  # the model's directory, which receipts commit to, is untouched
    written = packed.stat()
    lm, _ = load_model_dir(model, "target")  # the second load maps the file as it is
    assert np.array_equal(bits(lm.fork().extend(PROMPT)), expected) and mapped_shared(packed)
    assert packed_files(model) == [packed] and packed.stat().st_mtime_ns == written.st_mtime_ns
    assert packed.stat().st_ino == written.st_ino


@pytest.mark.parametrize("damage", ["flip", "truncate", "zero"])
def test_a_damaged_packed_file_is_packed_again_and_never_computed_with(seeded, expected, tmp_path, damage):
    model = shutil.copytree(seeded, tmp_path / "model")
    logits(model)
    (packed,) = packed_files(model)
    data = bytearray(packed.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) - 64]
    else:
        data = bytearray(len(data))
    packed.write_bytes(bytes(data))
    assert np.array_equal(logits(model), expected)
    (again,) = packed_files(model)
    assert again.read_bytes() != bytes(data) and again.stat().st_size >= len(data)


def test_a_stale_layouts_file_is_removed_when_the_current_one_is_written(seeded, tmp_path):
    model = shutil.copytree(seeded, tmp_path / "model")
    store_dir(model).mkdir(parents=True)
    stale = store_dir(model) / f"{PREFIX}000000000000000000000000{SUFFIX}"
    stale.write_bytes(b"an older kernel's layout")
    logits(model)
    assert stale not in packed_files(model) and len(packed_files(model)) == 1


def test_a_directory_that_cannot_hold_the_file_leaves_packing_to_the_process(tmp_path):
    from node.model.exact.kernel import library
    from node.model.exact.packed_store import open_packed

    (tmp_path / "a-file").write_text("not a folder")
    assert open_packed(library(), tmp_path / "a-file" / "packed", [], [], []) is None
