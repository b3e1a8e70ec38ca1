"""GGUF's block formats (docs/exact-arithmetic.md §2) decoded into their integers, and §4's exact
block products, in plain torch on any device.

A matrix [N, K] arrives as GGUF stores it: ``raw`` uint8 [N, K / QK · bytes], row n's blocks after
each other. ``decode`` gives the integers and the binary16 scales widened to binary32; ``dequantize``
§10's binary32 weights; ``matmul`` §3-4's product of binary32 activations with the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.model.exact.recipes import quantize_activations
from verifier.errors import SpecmarketError


class BlockFormatError(SpecmarketError):
    """A tensor whose type or size is not one of §2's block formats."""


@dataclass(frozen=True)
class BlockType:
    name: str
    qk: int  # weights per block
    nbytes: int  # bytes per block
    act_block: int  # §3: the activation block size it is multiplied with
    sub: int  # weights per sub-block with its own scale (the block itself where there is none)


Q8_0 = BlockType("Q8_0", 32, 34, 32, 32)
Q5_0 = BlockType("Q5_0", 32, 22, 32, 32)
Q4_K = BlockType("Q4_K", 256, 144, 256, 32)
Q6_K = BlockType("Q6_K", 256, 210, 256, 16)
TYPES = {t.name: t for t in (Q8_0, Q5_0, Q4_K, Q6_K)}
OFFSET = {"Q8_0": 0, "Q5_0": 16, "Q4_K": 0, "Q6_K": 32}  # q - OFFSET is the signed level (§2)


@dataclass(frozen=True)
class Decoded:
    """A matrix's blocks as integers: q [N, B, QK] (unsigned levels), sc and m [N, B, QK/sub]
    (Q4_K's 6-bit scales and mins; Q6_K's signed scales; ones for Q8_0/Q5_0), d and dmin [N, B]."""

    kind: BlockType
    q: torch.Tensor
    sc: torch.Tensor
    m: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor


def _half(raw: torch.Tensor, at: int) -> torch.Tensor:  # [N, B, bytes] -> [N, B] binary32
    return raw[..., at : at + 2].contiguous().view(torch.float16)[..., 0].float()


def decode(raw: torch.Tensor, kind: BlockType, k: int) -> Decoded:  # raw [N, K/QK · bytes] uint8
    if k % kind.qk or raw.shape[-1] != k // kind.qk * kind.nbytes:
        raise BlockFormatError(f"{kind.name}: {raw.shape[-1]} bytes a row do not hold {k} weights")
    blocks = raw.reshape(raw.shape[0], k // kind.qk, kind.nbytes).to(torch.int32)
    return {"Q8_0": _q8_0, "Q5_0": _q5_0, "Q4_K": _q4_k, "Q6_K": _q6_k}[kind.name](blocks, raw.reshape(blocks.shape))


def _ones(q: torch.Tensor, per: int) -> torch.Tensor:
    return torch.ones(*q.shape[:-1], q.shape[-1] // per, dtype=torch.int32, device=q.device)


def _q8_0(b: torch.Tensor, raw: torch.Tensor) -> Decoded:
    q = raw[..., 2:34].contiguous().view(torch.int8).to(torch.int32)  # signed: OFFSET 0
    d = _half(raw, 0)
    return Decoded(Q8_0, q, _ones(q, 32), _ones(q, 32) * 0, d, torch.zeros_like(d))


def _q5_0(b: torch.Tensor, raw: torch.Tensor) -> Decoded:
    qh = b[..., 2] | b[..., 3] << 8 | b[..., 4] << 16 | b[..., 5] << 24  # little-endian (int32 wraps: bits kept)
    qs = b[..., 6:22]
    bits = torch.arange(32, device=b.device)
    high = ((qh[..., None] >> bits) & 1) << 4  # [N, B, 32]
    q = torch.cat((qs & 15, qs >> 4), dim=-1) | high
    d = _half(raw, 0)
    return Decoded(Q5_0, q, _ones(q, 32), _ones(q, 32) * 0, d, torch.zeros_like(d))


def _q4_k(b: torch.Tensor, raw: torch.Tensor) -> Decoded:
    s = b[..., 4:16]
    sc = torch.cat((s[..., 0:4] & 63, (s[..., 8:12] & 15) | (s[..., 0:4] >> 6) << 4), dim=-1)  # [N, B, 8]
    m = torch.cat((s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4), dim=-1)
    qs = b[..., 16:144].reshape(*b.shape[:-1], 4, 32)  # [N, B, chunk, 32]
    q = torch.stack((qs & 15, qs >> 4), dim=-2).reshape(*b.shape[:-1], 256)  # chunk c: low 32, high 32
    return Decoded(Q4_K, q, sc, m, _half(raw, 0), _half(raw, 2))


def _q6_k(b: torch.Tensor, raw: torch.Tensor) -> Decoded:
    ql = b[..., 0:128].reshape(*b.shape[:-1], 2, 2, 32)  # [N, B, c, s & 1, l]
    qh = b[..., 128:192].reshape(*b.shape[:-1], 2, 1, 32)  # [N, B, c, 1, l]
    low = torch.stack((ql & 15, ql >> 4), dim=-3)  # [N, B, c, s >> 1, s & 1, l]
    low = low.reshape(*b.shape[:-1], 2, 4, 32)  # s = 2 (s >> 1) + (s & 1)
    shifts = (2 * torch.arange(4, device=b.device)).reshape(4, 1)
    high = (qh >> shifts) & 3  # [N, B, c, 4, l]
    q = (low | high << 4).reshape(*b.shape[:-1], 256)
    sc = raw[..., 192:208].contiguous().view(torch.int8).to(torch.int32)
    d = _half(raw, 208)
    return Decoded(Q6_K, q, sc, torch.zeros_like(sc), d, torch.zeros_like(d))


def dequantize(dec: Decoded) -> torch.Tensor:  # -> [N, K] binary32, §10's formulas
    kind, per = dec.kind, dec.kind.sub
    level = (dec.q - OFFSET[kind.name]).float()
    scale = (dec.d[..., None] * dec.sc.float()).repeat_interleave(per, dim=-1)  # fl(d · sc_j)
    w = scale * level
    if kind is Q4_K:
        w = w - (dec.dmin[..., None] * dec.m.float()).repeat_interleave(per, dim=-1)
    return w.reshape(w.shape[0], -1)


CHUNK = 2048  # output columns per step of the reference product (bounds its int64 temporaries)


def matmul(x: torch.Tensor, dec: Decoded) -> torch.Tensor:  # x [M, K] binary32 -> [M, N]
    """§4: exact integer block products, c_b per block, folded over the blocks in order."""
    xq, dx = quantize_activations(x, dec.kind.act_block)  # [M, K], [M, B]
    parts = []
    for lo in range(0, dec.q.shape[0], CHUNK):
        cut = slice(lo, lo + CHUNK)
        part = Decoded(dec.kind, dec.q[cut], dec.sc[cut], dec.m[cut], dec.d[cut], dec.dmin[cut])
        parts.append(_product(xq, dx, part))
    return torch.cat(parts, dim=1)


def _product(xq: torch.Tensor, dx: torch.Tensor, dec: Decoded) -> torch.Tensor:  # -> [M, N]
    kind = dec.kind
    rows, k = xq.shape
    n, blocks = dec.q.shape[0], dec.q.shape[1]
    xb = xq.reshape(rows, 1, blocks, k // blocks // kind.sub, kind.sub).long()  # [M, 1, B, S, sub]
    level = (dec.q - OFFSET[kind.name]).reshape(1, n, blocks, -1, kind.sub).long()  # [1, N, B, S, sub]
    dots = (xb * level).sum(-1)  # [M, N, B, S], exact integers
    a = (dots * dec.sc.long()[None]).sum(-1)  # [M, N, B]
    scale = dx[:, None, :] * dec.d[None]  # fl(dx · d)
    c = scale * a.float()
    if kind is Q4_K:
        bsum = xb.sum(-1)  # [M, 1, B, S]
        b = (bsum * dec.m.long()[None]).sum(-1)
        c = c - (dx[:, None, :] * dec.dmin[None]) * b.float()
    out = torch.zeros(rows, n, dtype=torch.float32, device=xq.device)
    for i in range(blocks):  # the fold over blocks, in order (§4)
        out = out + c[..., i]
    return out
