"""The C products of node/model/exact/exact.c (and exact_amx.c) against the torch reference, bit for bit,
for every block format, on every path this CPU has (scalar, AVX2, AVX-512 VNNI, AMX): at pass widths 1,
2, 7, 8, 9, 16, 17, 64 and past the kernels' row chunks (67 for VNNI's 64, 16-row groups for AMX, 257+
for AMX's 256), with column counts that leave partial column tiles (16 for AVX-512 and AMX, 8 for
AVX2), block counts that leave a Q8_0/Q5_0 block unpaired, each row alone as in the whole pass, and
blocks at the integer bounds the SIMD tricks rely on (vpmaddubsw saturation, int16 packs). The Q4_K and
Q6_K products on matrices repacked at load (exact_pack.c) are the reference too, at every width from 1
to 67 and 300, with partial tiles, side by side in a wider output and with the rows prepared once."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_exact_recipes import random_blocks

from node.model.exact.blocks import TYPES, decode, matmul

EXACT = Path(__file__).resolve().parents[1] / "node" / "model" / "exact"
SOURCES = [str(EXACT / name) for name in ("exact.c", "exact_vnni.c", "exact_amx.c", "exact_pack.c")]
CODES = {"Q8_0": 0, "Q5_0": 1, "Q4_K": 2, "Q6_K": 3}
QK_K = 256
VNNI = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
AMX = ("amx_tile", "amx_int8")
ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int] + [
    ctypes.c_void_p
] * 2
WIDTHS = (1, 2, 7, 8, 9, 16, 17, 64, 67)  # 17: past AMX's group of 16 rows; 67: past VNNI's chunk of 64
PACKABLE_PATHS = ("ex_matmul_vnni", "ex_matmul_amx")  # the paths with a product on packed matrices


def cpu_flags() -> set[str]:
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), ":")
    return set(flags.split(":", 1)[1].split())


def amx_usable(path: Path) -> bool:
    """The library's tile probe, in a child process (a refusal must not end the test run)."""
    code = f"import ctypes, sys; sys.exit(ctypes.CDLL({str(path)!r}).ex_amx_probe())"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("exact") / "exact.so"
    flags = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"] if all(f in cpu_flags() for f in VNNI) else []
    amx = bool(flags) and all(f in cpu_flags() for f in AMX)
    flags += ["-mamx-tile", "-mamx-int8"] if amx else []
    cmd = ["cc", "-O3", "-std=c11", "-ffp-contract=off", "-mavx2", *flags, "-fPIC", "-shared", "-o", str(out)]
    subprocess.run([*cmd, *SOURCES, "-lm"], check=True, capture_output=True, text=True, timeout=120)
    library = ctypes.CDLL(str(out))
    library.ex_scratch_bytes.restype, library.ex_scratch_bytes.argtypes = ctypes.c_size_t, [ctypes.c_int] * 2
    paths = ["ex_matmul_ref", "ex_matmul_avx2"] + (["ex_matmul_vnni"] if flags else [])
    if amx and amx_usable(out) and library.ex_amx_enable() == 0:
        paths.append("ex_matmul_amx")
    for name in paths:
        getattr(library, name).argtypes = ARGS
    library.paths = paths
    library.packed_paths = [f"ex_matmul_packed_{p[len('ex_matmul_') :]}" for p in paths if p in PACKABLE_PATHS]
    for name in library.packed_paths:
        getattr(library, name).argtypes = [*ARGS[:7], ctypes.c_int, ctypes.c_void_p]
    if library.packed_paths:
        library.ex_packed_bytes.restype, library.ex_packed_bytes.argtypes = ctypes.c_size_t, [ctypes.c_int] * 3
        library.ex_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return library


def call(lib, path: str, name: str, raw: np.ndarray, n: int, k: int, x: np.ndarray) -> tuple[int, np.ndarray]:
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], n), np.float32)
    scratch = np.zeros(lib.ex_scratch_bytes(x.shape[0], k), np.uint8)
    rc = getattr(lib, path)(
        CODES[name], raw.ctypes.data, n, k, x.ctypes.data, x.shape[0], out.ctypes.data, scratch.ctypes.data
    )
    return rc, out


def run(lib, path: str, name: str, raw: np.ndarray, n: int, k: int, x: np.ndarray) -> np.ndarray:
    rc, out = call(lib, path, name, raw, n, k, x)
    assert rc == 0
    return out


def reference(name: str, raw: np.ndarray, k: int, x: np.ndarray) -> np.ndarray:
    dec = decode(torch.from_numpy(raw), TYPES[name], k)
    return matmul(torch.from_numpy(np.ascontiguousarray(x)), dec).numpy().view(np.uint32)


def activations(rng: np.random.Generator, width: int, k: int) -> np.ndarray:
    x = (rng.standard_normal((width, k)) * 2).astype(np.float32)
    if width > 1:
        x[1, : min(k, 256)] = 0  # a zero block: dx = 0
    return x


# (k, n): a partial tile of 16 and of 8 columns; fewer columns than a tile; for Q8_0/Q5_0 an odd count
# of blocks (the AVX-512 path takes them two at a time)
SHAPES = {
    "Q8_0": [(768, 37), (96, 5)],
    "Q5_0": [(768, 37), (96, 5)],
    "Q4_K": [(768, 37), (256, 3)],
    "Q6_K": [(768, 37), (256, 3)],
}


@pytest.mark.parametrize("name", sorted(TYPES))
def test_every_path_is_the_reference_bit_for_bit_at_every_width_succeeds(lib, name):
    rng = np.random.default_rng(11)
    for k, n in SHAPES[name]:
        raw = random_blocks(TYPES[name], n, k, rng)
        for width in WIDTHS:
            x = activations(rng, width, k)
            want = reference(name, raw, k, x)
            for path in lib.paths:
                got = run(lib, path, name, raw, n, k, x)
                assert np.array_equal(got.view(np.uint32), want), (path, k, n, width)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_row_is_the_same_bits_alone_and_in_a_pass_of_any_width_succeeds(lib, name):
    rng = np.random.default_rng(12)
    k, n = 512, 21
    raw = random_blocks(TYPES[name], n, k, rng)
    x = activations(rng, 64, k)
    for path in lib.paths:
        whole = run(lib, path, name, raw, n, k, x)
        for width in (1, 7):
            parts = np.concatenate([run(lib, path, name, raw, n, k, x[r : r + width]) for r in range(0, 64, width)])
            assert np.array_equal(parts.view(np.uint32), whole.view(np.uint32)), (path, width)


def extreme_blocks(name: str, n: int, k: int, fill: int) -> np.ndarray:
    """Every byte `fill` (the largest or smallest levels; Q6_K's scales −128), the binary16 scales finite."""
    kind = TYPES[name]
    raw = np.full((n, k // kind.qk, kind.nbytes), fill, np.uint8)
    if name == "Q6_K":
        raw[..., 192:208] = 0x80  # sc = −128
    for at in {"Q8_0": [0], "Q5_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}[name]:
        raw[..., at : at + 2] = np.array([0.01], np.float16).view(np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_the_integer_bounds_hold_at_the_largest_levels_succeeds(lib, name):
    """Levels ±127 against the largest weights: where a SIMD trick could saturate or overflow, it shows."""
    k, n = 512, 19
    signs = np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32)
    xs = np.stack([np.full(k, 5.0, np.float32), np.full(k, -5.0, np.float32), 5.0 * signs])
    fills = (0xFF, 0x00, 0x80, 0x7F)  # Q8_0: −1, 0, −128, 127; nibbles 15 or 0; Q6_K q = 63 or 0
    for fill in fills:
        raw = extreme_blocks(name, n, k, fill)
        want = reference(name, raw, k, xs)
        for path in lib.paths:
            got = run(lib, path, name, raw, n, k, xs)
            assert np.array_equal(got.view(np.uint32), want), (path, hex(fill))


@pytest.mark.parametrize("name", sorted(TYPES))
def test_a_non_finite_activation_or_a_bad_shape_is_refused_succeeds(lib, name):
    rng = np.random.default_rng(13)
    k, n = 256, 9
    raw = random_blocks(TYPES[name], n, k, rng)
    for path in lib.paths:
        for bad in (np.nan, np.inf):
            x = activations(rng, 3, k)
            x[2, 100] = bad
            assert call(lib, path, name, raw, n, k, x)[0] == 1, path
        assert call(lib, path, name, raw, n, k - 16, activations(rng, 2, k - 16))[0] == 2, path


def test_the_amx_path_runs_here_or_says_why_succeeds(lib):
    """On a CPU with AMX the path must be among those compared above; elsewhere, a skip that says so."""
    if not all(f in cpu_flags() for f in VNNI + AMX):
        pytest.skip("this CPU lacks AMX (amx_tile, amx_int8) or AVX-512 VNNI: the AMX path is not compared here")
    assert "ex_matmul_amx" in lib.paths, "the CPU lists AMX but the tile probe or Linux's permission failed"


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_wide_passes_past_every_row_chunk_are_the_reference_succeeds(lib, name):
    """300 rows: past AMX's 256-row chunk (its weights swept twice) and VNNI's 64, with a partial group."""
    rng = np.random.default_rng(14)
    k, n = 512, 19
    raw = random_blocks(TYPES[name], n, k, rng)
    x = activations(rng, 300, k)
    want = reference(name, raw, k, x)
    for path in lib.paths[1:]:
        assert np.array_equal(run(lib, path, name, raw, n, k, x).view(np.uint32), want), path


def pack(lib, name: str, raw: np.ndarray, n: int, k: int) -> np.ndarray:
    out = np.zeros(lib.ex_packed_bytes(CODES[name], n, k) + 64, np.uint8)
    packed = out[-out.ctypes.data % 64 :][: len(out) - 64]  # 64-byte aligned, as the model's arena
    assert lib.ex_pack(CODES[name], raw.ctypes.data, n, k, packed.ctypes.data) == 0
    return packed


def run_packed(lib, path, name, packed, n, k, x, out=None, column=0, prepared=False) -> np.ndarray:
    """The packed product into out[:, column : column + n] (a fresh [M, n] without out); x is passed
    only where the scratch does not hold its prepared rows already (the model's shared quantization)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    own = out is None
    out = np.zeros((x.shape[0], n), np.float32) if own else out
    scratch = getattr(lib, "scratch", None)
    if not prepared:
        lib.scratch = scratch = np.zeros(lib.ex_scratch_bytes(x.shape[0], k), np.uint8)
    source = None if prepared else x.ctypes.data
    target = out.ctypes.data + 4 * column
    fn = getattr(lib, path)
    assert fn(CODES[name], packed.ctypes.data, n, k, source, x.shape[0], target, out.shape[1], scratch.ctypes.data) == 0
    return out


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_packed_products_are_the_reference_at_every_width_succeeds(lib, name):
    """Widths 1-67 (past VNNI's 64-row chunk) and 300, column counts with partial tiles of 16."""
    if not lib.packed_paths:
        pytest.skip("no AVX-512 VNNI here: matrices are not packed")
    rng = np.random.default_rng(15)
    for k, n in [(768, 37), (256, 3), (512, 16)]:
        raw = random_blocks(TYPES[name], n, k, rng)
        packed = pack(lib, name, raw, n, k)
        for width in [*range(1, 68), 300] if n == 37 else (1, 7, 17, 64, 67):
            x = activations(rng, width, k)
            want = reference(name, raw, k, x)
            for path in lib.packed_paths:
                got = run_packed(lib, path, name, packed, n, k, x)
                assert np.array_equal(got.view(np.uint32), want), (path, k, n, width)


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_packed_products_at_the_integer_bounds_succeed(lib, name):
    if not lib.packed_paths:
        pytest.skip("no AVX-512 VNNI here: matrices are not packed")
    k, n = 512, 19
    signs = np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32)
    xs = np.stack([np.full(k, 5.0, np.float32), np.full(k, -5.0, np.float32), 5.0 * signs])
    for fill in (0xFF, 0x00, 0x80, 0x7F):
        raw = extreme_blocks(name, n, k, fill)
        packed = pack(lib, name, raw, n, k)
        for path in lib.packed_paths:
            got = run_packed(lib, path, name, packed, n, k, xs)
            assert np.array_equal(got.view(np.uint32), reference(name, raw, k, xs)), (path, hex(fill))


def test_packed_parts_side_by_side_with_their_rows_prepared_once_succeeds(lib):
    """q, k and v (Q4_K, Q4_K, Q6_K) into one output [M, Σn] (rows Σn apart), the input quantized by the
    first product only: each part's columns are its own product's bits."""
    if not lib.packed_paths:
        pytest.skip("no AVX-512 VNNI here: matrices are not packed")
    rng = np.random.default_rng(16)
    k, parts = 512, [("Q4_K", 40), ("Q4_K", 16), ("Q6_K", 21)]
    raws = [random_blocks(TYPES[name], n, k, rng) for name, n in parts]
    total = sum(n for _, n in parts)
    for width in (1, 7, 28, 70):
        x = activations(rng, width, k)
        for path in lib.packed_paths:
            out, column = np.full((width, total), np.nan, np.float32), 0
            for i, ((name, n), raw) in enumerate(zip(parts, raws, strict=True)):
                run_packed(lib, path, name, pack(lib, name, raw, n, k), n, k, x, out, column, prepared=i > 0)
                assert np.array_equal(out[:, column : column + n].view(np.uint32), reference(name, raw, k, x)), path
                column += n


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K"])
def test_a_packed_column_unpacks_to_its_raw_blocks_succeeds(lib, name):
    """The inverse the AMX path reads a packed matrix through: every column's raw block back, byte for byte."""
    if not lib.packed_paths:
        pytest.skip("no AVX-512 VNNI here: matrices are not packed")
    rng = np.random.default_rng(17)
    k, n = 768, 21
    kind = TYPES[name]
    raw = random_blocks(kind, n, k, rng)
    packed = pack(lib, name, raw, n, k)
    tile_block = lib.ex_packed_bytes(CODES[name], 16, QK_K)
    blocks = raw.reshape(n, k // QK_K, kind.nbytes)
    lib.ex_unpack_column.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    for j in range(32):  # past n: the tile's last columns repeat column n - 1
        for b in range(k // QK_K):
            got = np.zeros(kind.nbytes, np.uint8)
            at = packed.ctypes.data + ((j // 16) * (k // QK_K) + b) * tile_block
            lib.ex_unpack_column(CODES[name], at, j % 16, got.ctypes.data)
            assert np.array_equal(got, blocks[min(j, n - 1), b]), (j, b)
