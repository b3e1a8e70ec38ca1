"""The C products of node/model/exact/exact.c against the torch reference, bit for
bit, for every block format, on every path this CPU has, at pass widths 1, 7 and 64."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from test_exact_recipes import random_blocks

from node.model.exact.blocks import TYPES, decode, matmul

SOURCE = str(Path(__file__).resolve().parents[1] / "node" / "model" / "exact" / "exact.c")
CODES = {"Q8_0": 0, "Q5_0": 1, "Q4_K": 2, "Q6_K": 3}
VNNI = ("avx512f", "avx512bw", "avx512_vnni")
ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int] + [
    ctypes.c_void_p
] * 2


def cpu_flags() -> set[str]:
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), ":")
    return set(flags.split(":", 1)[1].split())


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("exact") / "exact.so"
    flags = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"] if all(f in cpu_flags() for f in VNNI) else []
    cmd = [
        "cc",
        "-O3",
        "-std=c11",
        "-ffp-contract=off",
        "-mavx2",
        *flags,
        "-fPIC",
        "-shared",
        "-o",
        str(out),
        SOURCE,
        "-lm",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    library = ctypes.CDLL(str(out))
    library.ex_scratch_bytes.restype, library.ex_scratch_bytes.argtypes = ctypes.c_size_t, [ctypes.c_int] * 2
    paths = ["ex_matmul_ref", "ex_matmul_avx2"] + (["ex_matmul_vnni"] if flags else [])
    for name in paths:
        getattr(library, name).argtypes = ARGS
    library.paths = paths
    return library


def run(lib, path: str, name: str, raw: np.ndarray, n: int, k: int, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    out = np.zeros((x.shape[0], n), np.float32)
    scratch = np.zeros(lib.ex_scratch_bytes(x.shape[0], k), np.uint8)
    rc = getattr(lib, path)(
        CODES[name], raw.ctypes.data, n, k, x.ctypes.data, x.shape[0], out.ctypes.data, scratch.ctypes.data
    )
    assert rc == 0
    return out


@pytest.mark.parametrize("name", sorted(TYPES))
def test_every_path_is_the_reference_bit_for_bit_at_every_width_succeeds(lib, name):
    rng = np.random.default_rng(11)
    k, n = 768, 37
    raw = random_blocks(TYPES[name], n, k, rng)
    dec = decode(torch.from_numpy(raw), TYPES[name], k)
    for width in (1, 7, 64):
        x = (rng.standard_normal((width, k)) * 2).astype(np.float32)
        want = matmul(torch.from_numpy(x), dec).numpy().view(np.uint32)
        for path in lib.paths:
            got = run(lib, path, name, raw, n, k, x)
            assert np.array_equal(got.view(np.uint32), want), (path, width)
            alone = np.concatenate([run(lib, path, name, raw, n, k, x[r : r + 1]) for r in range(width)])
            assert np.array_equal(alone.view(np.uint32), want), (path, width)
