"""The reference recipes of docs/exact-arithmetic.md in plain torch, on any device.

Only operations that give the same bits on a CPU and a GPU are used (the issue's measurements on an
H200): tensor ÷ tensor, ×, +, −, ``torch.round`` (ties to even), comparisons, max, integer
arithmetic, binary16 → binary32, and folds written out as slices in a fixed order. Never
``x / python_float``, ``torch.sqrt`` in binary32, ``exp``, ``sum`` or ``softmax``.
Every function takes and returns binary32 tensors, its folds along the last dimension.
"""

from __future__ import annotations

import struct

import torch

from verifier.errors import SpecmarketError

FOLD_LANES = 16  # FOLD16 (§5)
ACT_LEVELS = 127  # int8 activations are in [-127, 127] (§3)
EXP_MIN, EXP_MAX = -87.0, 88.0  # exp's clamp (§6): 2^n stays a normal number
LOG2E = 0x3FB8AA3B  # binary32 bit patterns of §6's constants
EXP_C1 = 0x3F318000  # 0.693359375: n · C1 is exact
EXP_C2 = 0xB95E8083  # -2.12194440e-4
EXP_DEGREE = 7  # Taylor's polynomial; coefficients 1/k!, each rounded once to binary32


class NonFiniteActivation(SpecmarketError):
    """A pass produced an infinity or a NaN where §3 quantizes: an error, never a result."""


def f32_bits(bits: int) -> torch.Tensor:
    """The binary32 value with these bits, as a 0-d tensor."""
    return torch.tensor(struct.unpack("<f", struct.pack("<I", bits))[0], dtype=torch.float32)


def _const(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(value, dtype=torch.float32).to(like.device)


def fold16(a: torch.Tensor) -> torch.Tensor:  # [..., n] -> [...]
    """FOLD16 (§5): 16 lanes summed in index order, then the tree 8, 4, 2, 1."""
    n = a.shape[-1]
    pad = (-n) % FOLD_LANES
    if pad:  # adding +0 to a lane changes nothing (no term is -0 after x·x or exp; q·k lanes start at +0)
        a = torch.cat((a, a.new_zeros(*a.shape[:-1], pad)), dim=-1)
    lanes = a.reshape(*a.shape[:-1], -1, FOLD_LANES)  # [..., n/16, 16]
    acc = torch.zeros_like(lanes[..., 0, :])
    for i in range(lanes.shape[-2]):
        acc = acc + lanes[..., i, :]
    width = FOLD_LANES // 2
    while width:
        acc = acc[..., :width] + acc[..., width : 2 * width]
        width //= 2
    return acc[..., 0]


def sqrt_rn(v: torch.Tensor) -> torch.Tensor:
    """The correctly rounded binary32 square root (§7): taken in binary64, rounded once."""
    return v.double().sqrt().float()


def exp(x: torch.Tensor) -> torch.Tensor:
    """§6's exp: Cody–Waite reduction with Cephes' constants, degree-7 Taylor polynomial in Horner
    form, 2^n from its bits."""
    x = torch.clamp(x, EXP_MIN, EXP_MAX)
    n = torch.round(x * _const(f32_bits(LOG2E), x))
    r = x - n * _const(f32_bits(EXP_C1), x)
    r = r - n * _const(f32_bits(EXP_C2), x)
    p = torch.full_like(x, _factorial_reciprocal(EXP_DEGREE))
    for k in range(EXP_DEGREE - 1, -1, -1):
        p = p * r + _const(_factorial_reciprocal(k), x)
    two_n = ((n.to(torch.int32) + 127) << 23).view(torch.float32)
    return p * two_n


def _factorial_reciprocal(k: int) -> float:
    value = 1.0
    for i in range(2, k + 1):
        value /= i
    return float(torch.tensor(value, dtype=torch.float32))  # rounded once to binary32


def silu(x: torch.Tensor) -> torch.Tensor:
    """silu(x) = x / (1 + exp(-x)), each step rounded (§6)."""
    return x / (_const(1.0, x) + exp(-x))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:  # x [M, n], weight [n]
    """§7: inv = 1 / sqrt(FOLD16(x²) / n + ε), y = (x · inv) · w."""
    ss = fold16(x * x)
    v = ss / _const(float(x.shape[-1]), x) + _const(eps, x)
    inv = _const(1.0, x) / sqrt_rn(v)
    return (x * inv[..., None]) * weight


def quantize_activations(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """§3: x [M, K] -> (x̂ [M, K] int8 values as int32, dx [M, K/block] binary32)."""
    if not bool(torch.isfinite(x).all()):
        raise NonFiniteActivation("a non-finite activation reached a product")
    rows, k = x.shape
    blocks = x.reshape(rows, k // block, block)
    amax = blocks.abs().amax(dim=-1)  # [M, B], exact
    dx = amax / _const(float(ACT_LEVELS), x)
    safe = torch.where(dx == 0, torch.ones_like(dx), dx)
    q = torch.round(blocks / safe[..., None]).clamp(-ACT_LEVELS, ACT_LEVELS)
    q = torch.where(dx[..., None] == 0, torch.zeros_like(q), q)
    return q.to(torch.int32).reshape(rows, k), dx
