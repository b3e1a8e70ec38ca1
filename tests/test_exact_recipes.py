"""docs/exact-arithmetic.md's block formats and recipes (node.model.exact), against independent
scalar implementations written here from the page, against the `gguf` package's dequantizers, and
against the published GGUF where `make setup` has assembled it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from node.model.exact.blocks import Q4_K, Q5_0, Q6_K, Q8_0, TYPES, decode, dequantize, matmul
from node.model.exact.recipes import NonFiniteActivation, exp, fold16, quantize_activations, rms_norm, sqrt_rn
from node.model.qwen_pair import GGUF_DIR

SEED = 20261205
TARGET_GGUF = GGUF_DIR / "qwen2.5-coder-1.5b-instruct.gguf"
F32 = np.float32


def random_blocks(kind, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:  # [rows, K/QK · bytes]
    """Random block bytes whose binary16 scales are finite and of a realistic size."""
    raw = rng.integers(0, 256, size=(rows, k // kind.qk, kind.nbytes), dtype=np.uint8)
    halves = {"Q8_0": [0], "Q5_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}[kind.name]
    for at in halves:
        scale = rng.uniform(1e-4, 2e-2, size=raw.shape[:2]).astype(np.float16)
        raw[..., at : at + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


GGML = {"Q8_0": GGMLQuantizationType.Q8_0, "Q5_0": GGMLQuantizationType.Q5_0,
        "Q4_K": GGMLQuantizationType.Q4_K, "Q6_K": GGMLQuantizationType.Q6_K}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TYPES))
def test_dequantize_is_the_gguf_packages_bit_for_bit_succeeds(name):
    kind, rng = TYPES[name], np.random.default_rng(SEED)
    raw = random_blocks(kind, 8, 4 * 256, rng)
    ours = dequantize(decode(torch.from_numpy(raw), kind, 4 * 256)).numpy()
    theirs = gguf_dequantize(raw, GGML[name]).reshape(8, -1)
    assert ours.dtype == theirs.dtype == F32 and np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.skipif(not TARGET_GGUF.is_file(), reason="the published GGUF is not assembled here (make setup)")
def test_the_published_blocks_decode_as_the_gguf_package_reads_them_succeeds():
    reader = GGUFReader(TARGET_GGUF)
    seen = set()
    for tensor in reader.tensors:
        name = tensor.tensor_type.name
        if name not in TYPES or name in seen:
            continue
        seen.add(name)
        k = int(tensor.shape[0])
        raw = np.asarray(tensor.data[:4]).reshape(4, -1)  # the first 4 rows, as published
        ours = dequantize(decode(torch.from_numpy(raw.copy()), TYPES[name], k)).numpy()
        assert np.array_equal(ours, gguf_dequantize(raw, tensor.tensor_type).reshape(4, k)), tensor.name
    assert seen == {"Q4_K", "Q6_K"}


# --- §3-4: the product, against a scalar reimplementation of the page ---------------------------


def scalar_quantize(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    q, scales = np.zeros(x.shape, dtype=np.int64), []
    for b in range(0, x.size, block):
        amax = F32(np.max(np.abs(x[b : b + block])))
        dx = F32(amax / F32(127))
        scales.append(dx)
        if dx != 0:
            for i in range(b, b + block):
                q[i] = min(127, max(-127, int(np.rint(F32(x[i] / dx)))))
    return q, np.array(scales, dtype=F32)


def scalar_row(x: np.ndarray, w_levels: np.ndarray, dec, n: int) -> F32:
    """Output n of row x by §3-4, one block at a time, binary32 scalars throughout."""
    kind = dec.kind
    q, dx = scalar_quantize(x, kind.act_block)
    s = F32(0)
    for b in range(dec.q.shape[1]):
        lo = b * kind.qk
        a = bsum = 0
        for j in range(kind.qk // kind.sub):
            sl = slice(lo + j * kind.sub, lo + (j + 1) * kind.sub)
            a += int(dec.sc[n, b, j]) * int(np.dot(q[sl], w_levels[n, sl]))
            bsum += int(dec.m[n, b, j]) * int(q[sl].sum())
        d, dmin = F32(dec.d[n, b]), F32(dec.dmin[n, b])
        c = F32(F32(dx[b] * d) * F32(a))
        if kind is Q4_K:
            c = F32(c - F32(F32(dx[b] * dmin) * F32(bsum)))
        s = F32(s + c)
    return s


@pytest.mark.parametrize("kind", [Q8_0, Q5_0, Q4_K, Q6_K], ids=lambda t: t.name)
def test_the_block_product_is_the_pages_bit_for_bit_succeeds(kind):
    rng = np.random.default_rng(SEED)
    k, n, rows = 512, 6, 3
    dec = decode(torch.from_numpy(random_blocks(kind, n, k, rng)), kind, k)
    x = rng.standard_normal((rows, k)).astype(F32) * F32(3)
    x[1, :256] = 0  # a zero block: dx = 0
    got = matmul(torch.from_numpy(x), dec).numpy()
    offset = {"Q8_0": 0, "Q5_0": 16, "Q4_K": 0, "Q6_K": 32}[kind.name]
    levels = (dec.q.reshape(n, k) - offset).numpy().astype(np.int64)
    want = np.array([[scalar_row(x[m], levels, dec, j) for j in range(n)] for m in range(rows)], dtype=F32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # and it is still the matrix: within the int8 activations' error of the float product
    exact = x.astype(np.float64) @ dequantize(dec).numpy().astype(np.float64).T
    assert np.abs(got - exact).max() <= 0.02 * np.abs(exact).max()


def test_a_row_is_the_same_bits_in_a_pass_of_any_width_succeeds():
    rng = np.random.default_rng(SEED)
    dec = decode(torch.from_numpy(random_blocks(Q4_K, 5, 768, rng)), Q4_K, 768)
    x = torch.from_numpy(rng.standard_normal((7, 768)).astype(F32))
    whole = matmul(x, dec)
    for m in range(7):
        assert torch.equal(matmul(x[m : m + 1], dec)[0], whole[m])


def test_activation_quantization_rounds_ties_to_even_and_refuses_non_finite_values_succeeds():
    x = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5] + [0.0] * 26])  # dx = 1: exact ties
    q, dx = quantize_activations(x, 32)
    assert dx.tolist() == [[1.0]] and q[0, :6].tolist() == [127, 0, 2, 2, 0, -2]
    assert quantize_activations(torch.zeros(1, 32), 32)[0].abs().sum() == 0
    for bad in (float("nan"), float("inf")):
        with pytest.raises(NonFiniteActivation):
            quantize_activations(torch.tensor([[bad] + [1.0] * 31]), 32)


# --- §5-7: folds, exp, the square root -----------------------------------------------------------


def test_fold16_is_sixteen_lanes_then_the_tree_succeeds():
    rng = np.random.default_rng(SEED)
    for n in (1, 15, 16, 17, 128, 1536, 1000):
        a = rng.standard_normal(n).astype(F32) * F32(1e3)
        lanes = [F32(0)] * 16
        for i in range(n):
            lanes[i % 16] = F32(lanes[i % 16] + a[i])
        width = 8
        while width:
            lanes = [F32(lanes[i] + lanes[i + width]) for i in range(width)]
            width //= 2
        assert fold16(torch.from_numpy(a)).numpy().view(np.uint32) == np.array(lanes[0], dtype=F32).view(np.uint32)


def test_exp_is_within_two_ulp_and_exact_at_its_edges_succeeds():
    x = torch.linspace(-87.0, 88.0, 2_000_003)
    got = exp(x).double()
    want = torch.exp(x.double())
    ulp = torch.from_numpy(np.spacing(want.float().numpy())).double()
    assert float(((got - want).abs() / ulp).max()) <= 2.0
    assert exp(torch.tensor([0.0])).item() == 1.0
    assert exp(torch.tensor([-1e4])).item() == exp(torch.tensor([-87.0])).item() > 0
    assert exp(torch.tensor([1e4])).item() == exp(torch.tensor([88.0])).item() < float("inf")


def test_sqrt_in_binary64_is_the_ieee_binary32_square_root_succeeds():
    """§7: on 2^22 inputs spread over binades 2^-40 .. 2^40 (RMSNorm's range and far past it)."""
    rng = np.random.default_rng(SEED)
    v = (rng.uniform(1, 2, 1 << 22) * np.exp2(rng.integers(-40, 41, 1 << 22))).astype(F32)
    ours = sqrt_rn(torch.from_numpy(v)).numpy()
    assert np.array_equal(ours.view(np.uint32), np.sqrt(v).view(np.uint32))  # numpy's is sqrtss: IEEE


def test_rms_norm_is_the_float64_norm_to_binary32_accuracy_succeeds():
    rng = np.random.default_rng(SEED)
    x, w = rng.standard_normal((4, 1536)).astype(F32), rng.uniform(0.5, 2, 1536).astype(F32)
    got = rms_norm(torch.from_numpy(x), torch.from_numpy(w), 1e-6).numpy()
    xd = x.astype(np.float64)
    want = xd / np.sqrt((xd * xd).mean(axis=1, keepdims=True) + 1e-6) * w
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
