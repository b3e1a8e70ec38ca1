"""A draft's 4- and 5-bit weights (node/model/packed.py's group layouts, skinny_gemm.c's grouped
product): GGUF Q5_0 blocks carried over exactly, the product equal to its integer definition up to
fp32 rounding, the AVX512-VNNI and AVX2 paths bit-identical, and rows that do not depend on the
pass width. The draft's precision never touches what the target samples; these pin down that the
kernel computes what the format says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import node.model.kernels as kernels
from node.model.kernels import library
from node.model.kernels.linear import PackedLinear
from node.model.packed import GROUP, QUANT_BITS, pack_groups, quantize_groups, unpack_groups

X_LEVELS = np.float32(127)  # skinny_gemm.c's int8 activations: absmax per row and group
SHAPES = [(1, 32), (5, 64), (37, 896), (130, 4864)]  # (N, K): ragged N, one group, real widths
WIDTHS = (1, 2, 3, 4, 5, 7, 8, 9, 13, 17)  # past a tile on either path (AVX2 4 rows, AVX-512 8)
RTOL = 1e-5  # of the sum of |terms|: fp32 rounding of the scaled group sums only


def _weights(n: int, k: int, bits: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(w fp32 [n, k], q [n, k], scales [n, k/32]) of a random grouped matrix."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32)
    q, scales = quantize_groups(w, bits)
    return w, q, scales


def _reference(x: np.ndarray, q: np.ndarray, scales: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The product by its definition, in float64: x quantized per row and group as the kernel does
    (fp32 absmax scale, round half to even), exact integer group sums, then both scales.
    Returns (value [m, n], sum of |terms| [m, n])."""
    m, k = x.shape
    groups = x.reshape(m, k // GROUP, GROUP)
    top = np.abs(groups).max(axis=2)
    inverse = np.divide(X_LEVELS, top, out=np.zeros_like(top), where=top > 0)
    xq = np.clip(np.rint(groups * inverse[..., None]), -X_LEVELS, X_LEVELS).astype(np.int64)
    wq = q.reshape(q.shape[0], k // GROUP, GROUP).astype(np.int64) - (1 << (bits - 1))
    sums = np.einsum("mgk,ngk->mng", xq, wq)  # exact
    terms = sums * scales.astype(np.float64)[None] * (top / X_LEVELS).astype(np.float64)[:, None, :]
    return terms.sum(axis=2), np.abs(terms).sum(axis=2)


def _product(fn, x: np.ndarray, packed: np.ndarray, n: int, bits: int) -> np.ndarray:
    out = np.empty((x.shape[0], n), dtype=np.float32)
    assert fn(x.ctypes.data, packed.ctypes.data, out.ctypes.data, x.shape[0], n, x.shape[1], bits) == 0
    return out


def test_q5_0_blocks_come_back_exactly_and_the_layout_round_trips_succeeds():
    """A GGUF Q5_0 block (the draft's own quantization) is (q - 16) d with its largest magnitude at
    q = 0: requantized by the same rule it comes back bit for bit, so the packed draft is the GGUF's."""
    rng = np.random.default_rng(0)
    n, k = 9, 96
    q = rng.integers(0, 32, size=(n, k), dtype=np.uint8)
    q[:, ::GROUP] = 0  # each group's largest magnitude, as llama.cpp's Q5_0 quantizer places it
    d = rng.uniform(1e-3, 2e-2, size=(n, k // GROUP)).astype(np.float16)
    w = (q.astype(np.float32) - 16) * np.repeat(d.astype(np.float32), GROUP, axis=1)
    q_back, d_back = quantize_groups(w, 5)
    assert np.array_equal(q_back, q) and np.array_equal(d_back, d)
    for bits in QUANT_BITS.values():
        _, q, scales = _weights(n, k, bits, seed=bits)
        zero = 1 << (bits - 1)
        want = (q.astype(np.float32) - zero) * np.repeat(scales.astype(np.float32), GROUP, axis=1)
        assert np.array_equal(unpack_groups(pack_groups(q, scales, bits), (n, k), bits), want)


@pytest.mark.parametrize("bits", list(QUANT_BITS.values()))
@pytest.mark.parametrize("n,k", SHAPES)
def test_grouped_product_equals_its_integer_definition_succeeds(n, k, bits):
    _, q, scales = _weights(n, k, bits, seed=n + k)
    packed = pack_groups(q, scales, bits)
    x = np.random.default_rng(1).standard_normal((max(WIDTHS), k)).astype(np.float32)
    x[0, :GROUP] = 0.0  # an all-zero group: scale 0, no division by it
    got = _product(kernels.group_gemm(library()), x, packed, n, bits)
    want, size = _reference(x, q, scales, bits)
    assert np.all(np.abs(got - want) <= RTOL * size + 1e-30)


@pytest.mark.skipif(not kernels.has_wide_path(kernels.VNNI_CPU_FLAGS), reason="this CPU has no AVX512-VNNI")
@pytest.mark.parametrize("bits", list(QUANT_BITS.values()))
@pytest.mark.parametrize("n,k", SHAPES)
def test_vnni_path_gives_the_avx2_paths_bits_succeeds(n, k, bits):
    """A drafter on a machine without AVX512-VNNI (Zen 3) drafts exactly what one with it drafts."""
    _, q, scales = _weights(n, k, bits, seed=3 * n + k)
    packed = pack_groups(q, scales, bits)
    rng = np.random.default_rng(2)
    for rows in WIDTHS:
        x = rng.standard_normal((rows, k)).astype(np.float32)
        avx2 = _product(library().skinny_gemm_qg, x, packed, n, bits)
        assert np.array_equal(avx2, _product(library().skinny_gemm_qg_vnni, x, packed, n, bits)), rows


@pytest.mark.parametrize("bits", list(QUANT_BITS.values()))
def test_grouped_rows_do_not_depend_on_the_pass_width_succeeds(bits):
    """Row m of a pass over many rows is bit-identical to a pass over row m alone (what lets the
    drafter's prefix cache hand a job the keys and values a prefill would compute)."""
    n, k = 37, 896
    _, q, scales = _weights(n, k, bits, seed=5)
    linear = PackedLinear(torch.from_numpy(pack_groups(q, scales, bits)), n, k, library(), bits=bits)
    x = torch.randn(max(WIDTHS), k)
    together = linear(x)
    for width in WIDTHS:
        assert torch.equal(linear(x[:width]), together[:width])
    assert torch.equal(torch.cat([linear(x[i : i + 1]) for i in range(x.shape[0])]), together)


def test_a_grouped_linear_needs_its_bits_reverts():
    packed = torch.from_numpy(pack_groups(*quantize_groups(np.ones((4, 32), np.float32), 5), 5))
    with pytest.raises(ValueError, match="bits"):
        PackedLinear(packed, 4, 32, library())


def test_isa_override_keeps_the_grouped_avx2_path_succeeds(monkeypatch):
    monkeypatch.setenv(kernels.ISA_ENV, "avx2")
    assert kernels.group_gemm(library()) is library().skinny_gemm_qg
