"""Drop-in replacements for ``nn.Linear``: the skinny kernel and oneDNN's prepacked weights."""

from __future__ import annotations

import ctypes

import torch

from node.model.kernels import LANES, SKINNY_MAX_ROWS, f16_gemm, group_gemm, i8_gemm


def is_exact_in_float16(weight: torch.Tensor) -> bool:
    """Whether every value of ``weight`` (fp32) survives a round trip through float16 unchanged."""
    return weight.dtype == torch.float32 and torch.equal(weight.half().float(), weight)


class SkinnyLinear(torch.nn.Module):
    """``nn.Linear`` without bias whose passes of up to SKINNY_MAX_ROWS rows run the skinny kernel.

    ``fused`` builds one over several linears with the same input (q, k and v; gate and up): one
    pass over their concatenated outputs. The original weights are kept, shared rather than copied
    (a tied LM head stays tied to the embedding), for wider passes; the kernel reads its own packed
    copy, in float16 where that holds every weight exactly (``half``), else in fp32.
    """

    def __init__(
        self,
        linear: torch.nn.Linear,
        lib: ctypes.CDLL,
        parts: list[torch.nn.Linear] | None = None,
        max_rows: int | None = SKINNY_MAX_ROWS,  # wider passes on torch's kernel; None: every pass on the kernel
    ) -> None:
        super().__init__()
        self.max_rows = max_rows
        parts = parts or [linear]
        self.weights = [part.weight for part in parts]  # each [N_i, K]
        if len(parts) == 1:
            self.weight = linear.weight  # still a parameter of the model (counted, tied, saved)
        self.in_features = linear.in_features
        self.out_features = sum(w.shape[0] for w in self.weights)
        block = lib.skinny_rows_per_block()
        weight = torch.cat([w.detach() for w in self.weights]).contiguous()  # [N, K], freed after packing
        packed = torch.empty(-(-self.out_features // block) * block * self.in_features)
        lib.skinny_pack(weight.data_ptr(), packed.data_ptr(), self.out_features, self.in_features)
        self.half = is_exact_in_float16(weight)
        self.register_buffer("packed", packed.half() if self.half else packed)
        self._gemm = f16_gemm(lib) if self.half else lib.skinny_gemm

    @classmethod
    def fused(cls, linears: list[torch.nn.Linear], lib: ctypes.CDLL, max_rows: int | None = SKINNY_MAX_ROWS):
        return cls(linears[0], lib, linears, max_rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        flat = x.reshape(-1, self.in_features)
        rows = flat.shape[0]
        if (self.max_rows is not None and rows > self.max_rows) or x.dtype != torch.float32 or x.requires_grad:
            return torch.cat([torch.nn.functional.linear(x, w) for w in self.weights], dim=-1)
        flat = flat.contiguous()
        out = torch.empty(rows, self.out_features, dtype=torch.float32)
        self._gemm(flat.data_ptr(), self.packed.data_ptr(), out.data_ptr(), rows, self.out_features, self.in_features)
        return out.reshape(*x.shape[:-1], self.out_features)


def _swap_linears(model: torch.nn.Module, make, accept=lambda linear: True) -> int:
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and accept(child):
                setattr(parent, name, make(child))
                swapped += 1
    return swapped


def use_skinny_linears(model: torch.nn.Module, lib: ctypes.CDLL) -> int:
    """Replace every bias-free fp32 ``nn.Linear`` whose input width is a multiple of LANES by a
    SkinnyLinear; returns how many. Others (GPT-2's Conv1D layers, biased layers) stay as they are."""

    def eligible(linear: torch.nn.Linear) -> bool:
        return linear.bias is None and linear.weight.dtype == torch.float32 and linear.in_features % LANES == 0

    return _swap_linears(model, lambda linear: SkinnyLinear(linear, lib), eligible)


def prepack_linears(model: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` by oneDNN's prepacked fp32 version (``MkldnnLinear``); returns how many."""
    from torch.utils.mkldnn import MkldnnLinear

    class Prepacked(torch.nn.Module):
        def __init__(self, linear: torch.nn.Linear) -> None:
            super().__init__()
            self.inner = MkldnnLinear(linear, torch.float32)

        def forward(self, x):  # [..., d_in] -> [..., d_out]; oneDNN takes 2-D input
            return self.inner(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)

    return _swap_linears(model, Prepacked)


class PackedLinear:
    """A linear map whose weights are already in the kernel's packed layout (node.model.packed,
    memory-mapped): every pass runs the skinny kernel, whatever its width, so a row's result is the
    same in a prefill as in a one-row decode or a verification pass (bit for bit). float16 weights,
    or a draft's: int8 with per-row ``scales`` (applied to the fp32 sums), or ``bits`` 4 or 5 (uint8
    bytes in the group layout, scales inside; the activations go to int8 in the kernel)."""

    def __init__(
        self, packed: torch.Tensor, out_features: int, in_features: int, lib: ctypes.CDLL, scales=None, bits=None
    ) -> None:
        if packed.dtype not in (torch.float16, torch.int8, torch.uint8) or in_features % LANES:
            raise ValueError(f"a packed linear needs float16, int8 or 4-/5-bit weights and K a multiple of {LANES}")
        if (packed.dtype == torch.int8) != (scales is not None) or (packed.dtype == torch.uint8) != (bits is not None):
            raise ValueError("int8 weights need their row scales, 4-/5-bit ones their bits (and float16 neither)")
        self.packed, self.out_features, self.in_features, self.scales = packed, out_features, in_features, scales
        if bits is not None:
            grouped = group_gemm(lib)
            self._gemm = lambda x, w, out, m, n, k: grouped(x, w, out, m, n, k, bits)
        else:
            self._gemm = i8_gemm(lib) if scales is not None else f16_gemm(lib)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        flat = x.reshape(-1, self.in_features).contiguous()
        m, n, k = flat.shape[0], self.out_features, self.in_features
        out = torch.empty(m, n, dtype=torch.float32)
        if self._gemm(flat.data_ptr(), self.packed.data_ptr(), out.data_ptr(), m, n, k):
            raise MemoryError(f"no memory for the {m} x {k} quantized activations of a grouped product")
        if self.scales is not None:
            out *= self.scales
        return out
