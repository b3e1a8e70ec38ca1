"""ops.c's ex_attention against §8 of docs/exact-arithmetic.md written out in torch (the recipes'
FOLD16 and exp, the values summed key by key), bit for bit, on the served build (AVX-512 where the CPU
has it: keys scored 16 at a time, the query heads of a KV head swept together) and on the AVX2-only
build (scalar folds): chains after contexts of 0 .. 599 positions (tails of every length past the
16-key blocks), trees, ragged lists of visible positions, and head shapes that take each of the
kernel's paths (heads of 128 and 64: values 64 dims at a time; 48 and 32: scalar values; GQA groups
of 1, 2, 6 (a sweep of 6 heads), 7 (values 6 + 1) and 16 (two sweeps of 8))."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from node.model.exact import kernel
from node.model.exact.recipes import exp, fold16

SHAPES = [  # heads, kv_heads, head_dim
    (12, 2, 128),  # Qwen2.5-Coder-1.5B
    (4, 2, 64),  # tests/exact_models.py
    (14, 2, 64),
    (16, 1, 32),
    (6, 2, 48),
    (3, 3, 128),
]


@pytest.fixture(scope="module")
def libraries() -> list[ctypes.CDLL]:
    return [kernel.library(), kernel.compiled(kernel.BASE_FLAGS)]


class Case:
    """A pass of ``rows`` query rows after ``start`` cached positions; row m sees the cache's first
    ``start`` positions, then ``lists[m]`` (None: a chain, row m seeing start .. start + m)."""

    def __init__(self, shape, start: int, rows: int, lists=None, seed: int = 0, spread: float = 1.0) -> None:
        heads, kv_heads, head_dim = shape
        gen = torch.Generator().manual_seed(seed)
        self.heads, self.kv_heads, self.head_dim, self.start, self.rows = heads, kv_heads, head_dim, start, rows
        self.q = torch.randn(rows, heads, head_dim, generator=gen) * spread  # a wide spread reaches exp's clamp
        self.keys = torch.randn(kv_heads, start + rows, head_dim, generator=gen)
        self.values = torch.randn(kv_heads, start + rows, head_dim, generator=gen)
        self.scale = float(torch.tensor(1.0) / torch.tensor(float(head_dim)).double().sqrt().float())
        self.lists = lists

    def seen(self, m: int) -> list[int]:
        return list(range(self.start + m + 1)) if self.lists is None else list(range(self.start)) + self.lists[m]

    def kernel(self, lib: ctypes.CDLL) -> torch.Tensor:  # -> [rows, heads · head_dim]
        qkv = torch.zeros(self.rows, (self.heads + 2 * self.kv_heads) * self.head_dim)  # the model's row stride
        qkv[:, : self.heads * self.head_dim] = self.q.reshape(self.rows, -1)
        out = torch.empty(self.rows, self.heads * self.head_dim)
        scratch = torch.empty(self.start + self.rows)
        tree = (None, None)
        if self.lists is not None:
            offsets = torch.tensor(np.cumsum([0] + [len(s) for s in self.lists]), dtype=torch.int32)
            visible = torch.tensor([p for s in self.lists for p in s] or [0], dtype=torch.int32)
            tree = (offsets.data_ptr(), visible.data_ptr())
        lib.ex_attention(
            qkv.data_ptr(), qkv.stride(0), self.keys.data_ptr(), self.values.data_ptr(), self.keys.shape[1],
            out.data_ptr(), self.rows, self.start, self.heads, self.kv_heads, self.head_dim, self.scale,
            scratch.data_ptr(), *tree,
        )  # fmt: skip
        return out

    def reference(self, m: int) -> torch.Tensor:  # -> [heads · head_dim], §8 step by step
        group = self.heads // self.kv_heads
        seen = self.seen(m)
        keys = self.keys[:, seen].repeat_interleave(group, dim=0)  # [H, n, hd]
        values = self.values[:, seen].repeat_interleave(group, dim=0)
        scores = fold16(self.q[m][:, None, :] * keys) * self.scale  # [H, n]
        e = exp(scores - scores.amax(dim=-1, keepdim=True))
        total = fold16(e)
        acc = torch.zeros(self.heads, self.head_dim)
        for j in range(len(seen)):  # in the row's key order
            acc = acc + e[:, j : j + 1] * values[:, j]
        return (acc / total[:, None]).reshape(-1)


def bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.int32)


def check(case: Case, libraries, rows_to_reference=None) -> None:
    got = [case.kernel(lib) for lib in libraries]
    for other in got[1:]:
        assert np.array_equal(bits(got[0]), bits(other))
    for m in rows_to_reference if rows_to_reference is not None else range(case.rows):
        assert np.array_equal(bits(got[0][m]), bits(case.reference(m))), f"row {m}"


@pytest.mark.parametrize("shape", SHAPES)
def test_chains_are_section_8_bit_for_bit_succeeds(shape, libraries):
    for start, rows in ((0, 1), (0, 20), (1, 1), (15, 2), (16, 1), (17, 16), (40, 7), (250, 28)):
        check(Case(shape, start, rows, seed=start * 31 + rows), libraries)


def test_every_tail_length_is_section_8_bit_for_bit_succeeds(libraries):
    """Contexts 1 .. 600 keys: every count of keys past the 16-key blocks, at both ends of the range."""
    for start in [*range(0, 40), *range(560, 600)]:
        check(Case((12, 2, 128), start, 1, seed=start, spread=3.0), libraries)


def test_long_wide_passes_match_the_scalar_build_succeeds(libraries):
    """Past what the torch reference can check quickly: the served build against the scalar build,
    the reference on a few rows."""
    check(Case((12, 2, 128), 512, 64, seed=7, spread=4.0), libraries, rows_to_reference=(0, 63))
    check(Case((4, 2, 64), 0, 300, seed=8), libraries, rows_to_reference=(299,))


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_trees_and_ragged_lists_are_section_8_bit_for_bit_succeeds(shape, libraries):
    start, rows = 37, 24
    rng = np.random.default_rng(5)
    parents = [-1] + [int(rng.integers(-1, m)) for m in range(1, rows)]  # a random tree
    lists: list[list[int]] = []
    for m, parent in enumerate(parents):
        lists.append(([] if parent < 0 else lists[parent]) + [start + m])
    check(Case(shape, start, rows, lists, seed=1), libraries)
    sizes = rng.integers(1, rows + 1, size=rows)  # any positions of the pass, in order, 1 .. rows of them
    ragged = [sorted((start + rng.choice(rows, size=int(k), replace=False)).tolist()) for k in sizes]
    check(Case(shape, start, rows, ragged, seed=2, spread=3.0), libraries)
    check(Case(shape, 0, rows, [[m] for m in range(rows)], seed=3), libraries)  # each row itself only
