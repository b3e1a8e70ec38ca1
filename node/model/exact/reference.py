"""The Qwen2 forward of docs/exact-arithmetic.md §8-10 in plain torch, on any device: the oracle that
the C kernel and a GPU operator must match bit for bit. Slow by design (integer products as int64
tensors, folds written out): it defines, it does not serve.

The weights are the GGUF's tensors as published (``from_gguf``), or any mapping of GGUF tensor names
to ``Weight`` (tests build seeded ones). The KV cache is binary32 (§8); a pass of M rows is a chain
after the cached positions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from node.model.exact.blocks import TYPES, Decoded, decode, dequantize, matmul
from node.model.exact.recipes import exp, fold16, rms_norm, silu, sqrt_rn

ROPE_MARGIN = 2e-11  # |float64 value - binary32 midpoint| under which a table entry is recomputed exactly
ROPE_DIGITS = 40  # mpmath's precision for those entries


@dataclass(frozen=True)
class QwenShape:
    d: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    eps: float
    theta: float
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.d // self.heads


@dataclass
class Weight:
    """A GGUF tensor: block-quantized (``raw`` uint8 [N, bytes], ``kind`` a §2 type) or binary32."""

    kind: str  # "F32" or a block type's name
    data: torch.Tensor  # binary32 values, or the raw bytes [N, K/QK · bytes]
    k: int = 0  # the row length of a block-quantized matrix

    def decoded(self) -> Decoded:
        """Decoded at each use: the whole 1.5B model's integers would take 6 GB as int32."""
        return decode(self.data, TYPES[self.kind], self.k)


def rope_tables(theta: float, head_dim: int, positions: int) -> tuple[np.ndarray, np.ndarray]:  # each [P, hd/2]
    """§9: binary32 nearest to cos and sin of p · θ^(-2i/hd): binary64 where it decides, mpmath where
    the binary64 value lies within ROPE_MARGIN of a binary32 rounding boundary."""
    freqs = theta ** (-2.0 * np.arange(head_dim // 2) / head_dim)
    angles = np.arange(positions, dtype=np.float64)[:, None] * freqs[None, :]
    return _nearest(angles, np.cos, "cos", theta, head_dim), _nearest(angles, np.sin, "sin", theta, head_dim)


def _nearest(angles: np.ndarray, fn, name: str, theta: float, head_dim: int) -> np.ndarray:
    import mpmath

    wide = fn(angles)
    table = wide.astype(np.float32)
    other = np.nextafter(table, np.where(wide > table, np.inf, -np.inf).astype(np.float32))
    midpoint = (table.astype(np.float64) + other.astype(np.float64)) / 2
    with mpmath.workdps(ROPE_DIGITS):
        for p, i in zip(*np.nonzero(np.abs(wide - midpoint) < ROPE_MARGIN), strict=True):
            angle = p * mpmath.power(theta, mpmath.mpf(-2 * int(i)) / head_dim)
            table[p, i] = np.float32(float(getattr(mpmath, name)(angle)))  # binary64 of 40 digits, then binary32
    return table


class ExactReference:
    """The model of ``weights`` (GGUF names), with one job's binary32 KV cache."""

    def __init__(self, weights: Mapping[str, Weight], shape: QwenShape, positions: int = 4096) -> None:
        self.w, self.shape = weights, shape
        cos, sin = rope_tables(shape.theta, shape.head_dim, positions)
        self.cos, self.sin = torch.from_numpy(cos), torch.from_numpy(sin)
        self.scale = torch.tensor(1.0) / sqrt_rn(torch.tensor(float(shape.head_dim)))
        self.keys: list[torch.Tensor] = [torch.empty(shape.kv_heads, 0, shape.head_dim) for _ in range(shape.layers)]
        self.values = [k.clone() for k in self.keys]

    @classmethod
    def from_gguf(cls, path: Path, layers: int | None = None, positions: int = 4096) -> ExactReference:
        """The published GGUF's tensors (its first ``layers`` layers, then the output head)."""
        from gguf import GGUFReader

        reader = GGUFReader(path)
        fields = {f.name: f.parts[f.data[0]] for f in reader.fields.values() if f.data}
        get = lambda key: fields[f"qwen2.{key}"][0]  # noqa: E731
        weights, keep = {}, layers or int(get("block_count"))
        for t in reader.tensors:
            if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= keep:
                continue  # only the layers asked for are read out of the map
            kind, tensor = t.tensor_type.name, torch.from_numpy(np.asarray(t.data).copy())
            weights[t.name] = Weight(kind, tensor, int(t.shape[0])) if kind in TYPES else Weight("F32", tensor)
        shape = QwenShape(
            int(get("embedding_length")), int(get("feed_forward_length")), layers or int(get("block_count")),
            int(get("attention.head_count")), int(get("attention.head_count_kv")),
            float(get("attention.layer_norm_rms_epsilon")), float(get("rope.freq_base")),
            weights["output.weight"].data.shape[0],
        )  # fmt: skip
        return cls(weights, shape, positions)

    def embed(self, tokens: Sequence[int]) -> torch.Tensor:  # -> [M, d]
        w = self.w["token_embd.weight"]
        dec = w.decoded()
        rows = torch.tensor(list(tokens))
        return dequantize(Decoded(dec.kind, dec.q[rows], dec.sc[rows], dec.m[rows], dec.d[rows], dec.dmin[rows]))

    def linear(self, name: str, x: torch.Tensor, bias: bool = False) -> torch.Tensor:
        out = matmul(x, self.w[f"{name}.weight"].decoded())
        return out + self.w[f"{name}.bias"].data if bias else out

    def extend(self, tokens: Sequence[int]) -> torch.Tensor:  # -> [M, V] binary32 logits
        x = self.embed(tokens)
        start = self.keys[0].shape[1]
        for i in range(self.shape.layers):
            x = self.layer(i, x, start)
        x = rms_norm(x, self.w["output_norm.weight"].data, self.shape.eps)
        return self.linear("output", x)

    def layer(self, i: int, x: torch.Tensor, start: int) -> torch.Tensor:
        b, s = f"blk.{i}.", self.shape
        h = rms_norm(x, self.w[b + "attn_norm.weight"].data, s.eps)
        q, k, v = (self.linear(b + name, h, bias=True) for name in ("attn_q", "attn_k", "attn_v"))
        positions = torch.arange(start, start + x.shape[0])
        q = self.rope(q.reshape(-1, s.heads, s.head_dim), positions)
        k = self.rope(k.reshape(-1, s.kv_heads, s.head_dim), positions)
        self.keys[i] = torch.cat((self.keys[i], k.transpose(0, 1)), dim=1)  # [KV, L, hd]
        self.values[i] = torch.cat((self.values[i], v.reshape(-1, s.kv_heads, s.head_dim).transpose(0, 1)), dim=1)
        attended = torch.stack([self.attend(i, q[r], start + r + 1) for r in range(x.shape[0])])
        x = x + self.linear(b + "attn_output", attended)
        h = rms_norm(x, self.w[b + "ffn_norm.weight"].data, s.eps)
        gated = silu(self.linear(b + "ffn_gate", h)) * self.linear(b + "ffn_up", h)
        return x + self.linear(b + "ffn_down", gated)

    def rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:  # [M, heads, hd]
        half = x.shape[-1] // 2
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        a, b = x[..., :half], x[..., half:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)

    def attend(self, i: int, q: torch.Tensor, seen: int) -> torch.Tensor:  # q [H, hd] -> [H · hd]
        s = self.shape
        group = s.heads // s.kv_heads
        keys = self.keys[i][:, :seen].repeat_interleave(group, dim=0)  # [H, n, hd]
        values = self.values[i][:, :seen].repeat_interleave(group, dim=0)
        scores = fold16(q[:, None, :] * keys) * self.scale  # [H, n]
        e = exp(scores - scores.amax(dim=-1, keepdim=True))
        total = fold16(e)  # [H]
        acc = torch.zeros_like(q)
        for j in range(seen):  # in cache order (§8)
            acc = acc + e[:, j : j + 1] * values[:, j]
        return (acc / total[:, None]).reshape(-1)
