"""The torch reference forward of docs/exact-arithmetic.md (node.model.exact.reference) on a seeded
Qwen2-shaped model in the GGUF's block formats: a row is the same bits whatever pass it is in, and
the RoPE tables are the correctly rounded values."""

from __future__ import annotations

import mpmath
import numpy as np
import torch
from test_exact_recipes import random_blocks

from node.model.exact.blocks import Q4_K, Q6_K, TYPES
from node.model.exact.reference import ExactReference, QwenShape, Weight, rope_tables

SEED = 7
SHAPE = QwenShape(d=256, inter=512, layers=2, heads=4, kv_heads=2, eps=1e-6, theta=1e6, vocab=96)
TOKENS = [3, 17, 5, 88, 41, 0, 63]


def seeded_model(shape: QwenShape = SHAPE) -> ExactReference:
    """Q4_K everywhere but attn_v and ffn_down of layer 1 and the head (Q6_K), as the Q4_K_M target mixes them."""
    rng = np.random.default_rng(SEED)
    kv = shape.kv_heads * shape.head_dim

    def matrix(n: int, k: int, kind=Q4_K) -> Weight:
        return Weight(kind.name, torch.from_numpy(random_blocks(kind, n, k, rng)), k)

    def vector(n: int, around: float = 1.0) -> Weight:
        return Weight("F32", torch.from_numpy(rng.uniform(0.5 * around, 1.5 * around, n).astype(np.float32)))

    w = {"token_embd.weight": matrix(shape.vocab, shape.d), "output.weight": matrix(shape.vocab, shape.d, Q6_K)}
    w["output_norm.weight"] = vector(shape.d)
    for i in range(shape.layers):
        b, wide = f"blk.{i}.", Q6_K if i == 1 else Q4_K
        w |= {b + "attn_norm.weight": vector(shape.d), b + "ffn_norm.weight": vector(shape.d)}
        w |= {b + "attn_q.weight": matrix(shape.d, shape.d), b + "attn_k.weight": matrix(kv, shape.d)}
        w |= {b + "attn_v.weight": matrix(kv, shape.d, wide), b + "attn_output.weight": matrix(shape.d, shape.d)}
        w |= {
            b + "attn_q.bias": vector(shape.d, 0.1),
            b + "attn_k.bias": vector(kv, 0.1),
            b + "attn_v.bias": vector(kv, 0.1),
        }
        w |= {b + "ffn_gate.weight": matrix(shape.inter, shape.d), b + "ffn_up.weight": matrix(shape.inter, shape.d)}
        w[b + "ffn_down.weight"] = matrix(shape.d, shape.inter, wide)
    return ExactReference(w, shape, positions=64)


def test_a_row_is_the_same_bits_in_a_prefill_and_in_single_steps_succeeds():
    whole = seeded_model().extend(TOKENS)
    assert torch.isfinite(whole).all() and whole.std() > 0
    stepped = seeded_model()
    steps = torch.cat([stepped.extend([t]) for t in TOKENS])
    split = seeded_model()
    halves = torch.cat((split.extend(TOKENS[:3]), split.extend(TOKENS[3:])))
    assert torch.equal(whole, steps) and torch.equal(whole, halves)


def test_the_model_uses_both_k_quant_formats_succeeds():
    kinds = {w.kind for w in seeded_model().w.values()}
    assert kinds == {"F32", "Q4_K", "Q6_K"} and kinds - {"F32"} <= set(TYPES)


def test_rope_tables_are_the_correctly_rounded_values_succeeds():
    """Every tenth entry of 512 positions × 64 frequencies, against mpmath at 40 digits."""
    theta, head_dim = 1e6, 128
    cos, sin = rope_tables(theta, head_dim, 512)
    rng = np.random.default_rng(SEED)
    with mpmath.workdps(40):
        for p, i in zip(rng.integers(0, 512, 3277), rng.integers(0, 64, 3277), strict=True):
            angle = int(p) * mpmath.power(theta, mpmath.mpf(-2 * int(i)) / head_dim)
            assert cos[p, i] == np.float32(float(mpmath.cos(angle))), (p, i)
            assert sin[p, i] == np.float32(float(mpmath.sin(angle))), (p, i)
