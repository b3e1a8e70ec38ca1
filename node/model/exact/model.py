"""An exact model directory served on the C kernel: the lean forward (node.model.kernels.llama)
with docs/exact-arithmetic.md's operations, a ``verifier.LanguageModel`` like every other target.

The directory (``convert.write_exact``) holds the GGUF as published, the RoPE tables made at
conversion, ``config.json`` naming the arithmetic, and the tokenizer. The products read the GGUF's
blocks in place from one memory map (no float16 copy is made); norms, RoPE, attention and SiLU run
ops.c; the embedding's rows are dequantized by §10's formulas; the residual and bias additions are
single binary32 additions. Every pass, prefill included, runs this one code path row by row, so a
row's logits never depend on the pass width or on the other jobs of a batched pass, and the
operator, plain decoding, a challenger and a referee compute the same bits
(tests/test_exact_model.py checks them against node.model.exact.reference).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from node.model.exact import ARITHMETIC_KEY, ARITHMETIC_VERSION
from node.model.exact.blocks import TYPES, Decoded, decode, dequantize
from node.model.exact.kernel import matmul
from node.model.kernels.llama import LeanLM
from node.model.kernels.rows import RowLayout
from node.model.packed import PackedModelError

FILES_KEY = "specmarket_exact"  # config.json's field naming the weights and the RoPE tables
SUPPORTED = ("qwen2",)
MAX_HEAD_DIM = 256  # ops.c's


@dataclass(frozen=True)
class Matrix:
    """A GGUF matrix [n, k] in place: its block type and its bytes [n, k / QK · bytes] (memory-mapped)."""

    kind: str
    raw: np.ndarray
    n: int
    k: int


class ExactLinear:
    """x · Wᵀ for one matrix or several (q, k and v; their outputs side by side), each §3-4's product."""

    def __init__(self, parts: Sequence[Matrix], lib: ctypes.CDLL) -> None:
        self.parts, self._lib = list(parts), lib
        self.out_features = sum(p.n for p in parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, k] -> [M, Σn]
        outs = [matmul(self._lib, p.kind, p.raw.ctypes.data, p.n, p.k, x) for p in self.parts]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


class ExactRMSNorm:
    """§7's RMSNorm, row by row."""

    def __init__(self, weight: torch.Tensor, eps: float, lib: ctypes.CDLL) -> None:  # weight [d]
        self.weight, self.eps, self._lib = weight.contiguous(), eps, lib

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, d] -> [M, d]
        x = x.contiguous()
        out = torch.empty_like(x)
        self._lib.ex_rms_norm(x.data_ptr(), self.weight.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], self.eps)
        return out


class _ExactLayer:
    """One decoder layer: the attributes the lean forward and the batched pass read."""

    def __init__(self, gguf: _Gguf, i: int, eps: float, lib: ctypes.CDLL) -> None:
        b = f"blk.{i}."
        self.input_norm = ExactRMSNorm(gguf.vector(b + "attn_norm.weight"), eps, lib)
        self.post_norm = ExactRMSNorm(gguf.vector(b + "ffn_norm.weight"), eps, lib)
        self.qkv = ExactLinear([gguf.matrix(b + f"attn_{x}.weight") for x in "qkv"], lib)
        self.qkv_bias = torch.cat([gguf.vector(b + f"attn_{x}.bias") for x in "qkv"])  # [q + 2 kv]
        self.o = ExactLinear([gguf.matrix(b + "attn_output.weight")], lib)
        self.gate = ExactLinear([gguf.matrix(b + "ffn_gate.weight")], lib)
        self.up = ExactLinear([gguf.matrix(b + "ffn_up.weight")], lib)
        self.down = ExactLinear([gguf.matrix(b + "ffn_down.weight")], lib)
        self.intermediate = self.gate.out_features


class _Gguf:
    """A GGUF's tensors by name, memory-mapped (the ``gguf`` package's reader)."""

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.reader = GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}

    def _get(self, name: str):
        try:
            return self.tensors[name]
        except KeyError:
            raise PackedModelError(f"the GGUF has no tensor {name}") from None

    def matrix(self, name: str) -> Matrix:
        t = self._get(name)
        kind = t.tensor_type.name
        if kind not in TYPES:
            raise PackedModelError(f"{name} is {kind}, not one of the exact arithmetic's block types {sorted(TYPES)}")
        return Matrix(kind, t.data, int(t.shape[1]), int(t.shape[0]))

    def vector(self, name: str) -> torch.Tensor:  # binary32, copied out of the map
        t = self._get(name)
        if t.tensor_type.name != "F32":
            raise PackedModelError(f"{name} is {t.tensor_type.name}, expected F32")
        return torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(-1))


class ExactWeights:
    """What every job of one exact model shares: llama.LeanWeights' interface over the GGUF's map."""

    def __init__(self, directory: Path, cfg: dict, lib: ctypes.CDLL) -> None:
        files = cfg[FILES_KEY]
        gguf = _Gguf(Path(directory) / files["weights"])
        self.directory = Path(directory)
        d, eps = int(cfg["hidden_size"]), float(cfg["rms_norm_eps"])
        self.heads, self.kv_heads = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
        self.head_dim = d // self.heads
        self.scale = float(torch.tensor(1.0) / torch.tensor(float(self.head_dim)).double().sqrt().float())  # §8
        self._embed = gguf.matrix("token_embd.weight")
        self.layers = [_ExactLayer(gguf, i, eps, lib) for i in range(int(cfg["num_hidden_layers"]))]
        self.norm = ExactRMSNorm(gguf.vector("output_norm.weight"), eps, lib)
        self.head = ExactLinear([gguf.matrix("output.weight")], lib)
        self.cos, self.sin = _rope_tables(Path(directory) / files["rope"], int(cfg["max_position_embeddings"]), d)
        matrices = [t for t in gguf.tensors.values() if t.tensor_type.name in TYPES]
        self.parameter_count = sum(int(t.n_elements) for t in gguf.tensors.values())
        self.pass_bytes = sum(int(t.n_bytes) for t in matrices if t.name != "token_embd.weight")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [M] -> [M, d]: §10's dequantized rows
        e = self._embed
        raw = torch.from_numpy(np.ascontiguousarray(e.raw[ids.numpy()]))
        dec: Decoded = decode(raw, TYPES[e.kind], e.k)
        return dequantize(dec)

    def rotary(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:  # each [stop - start, hd / 2]
        return self.cos[start:stop], self.sin[start:stop]


def _rope_tables(path: Path, positions: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """§9's tables as stored at conversion: cos [P, hd / 2] then sin, binary32 little-endian."""
    data = np.fromfile(path, dtype="<f4")
    if data.size % (2 * positions):
        raise PackedModelError(f"{path}: {data.size} values are not two tables of {positions} positions")
    half = data.size // (2 * positions)
    tables = torch.from_numpy(data.reshape(2, positions, half))
    return tables[0], tables[1]


class ExactLM(LeanLM):
    """The lean forward with the exact arithmetic: shape-invariant by construction."""

    kernel = "exact"
    arithmetic = ARITHMETIC_VERSION

    def fork(self) -> ExactLM:
        return ExactLM(self.weights, self.name, self._lib, self.vocab_size, self.max_positions, True)

    def mlp(self, layer: _ExactLayer, hidden: torch.Tensor) -> torch.Tensor:  # [M, d] -> [M, d]
        h = layer.post_norm(hidden)
        gate, up = layer.gate(h), layer.up(h)  # [M, I] each
        gated = torch.empty_like(gate)
        self._lib.ex_silu_mul(
            gate.data_ptr(), up.data_ptr(), gated.data_ptr(), h.shape[0], layer.intermediate, layer.intermediate
        )
        return layer.down(gated)

    def attend(self, i, qkv, cos, sin, layout: RowLayout, scratch) -> torch.Tensor:  # qkv [M, q + 2 kv] -> [M, q]
        """Layer ``i``'s attention (§8-9): RoPE from the stored tables, the rows' keys and values into
        this cache, and each query row against what it sees of the cache."""
        w, rows, lib, start = self.weights, qkv.shape[0], self._lib, layout.start
        q_size, kv_size = w.heads * w.head_dim, w.kv_heads * w.head_dim
        cos, sin = cos.contiguous(), sin.contiguous()
        lib.ex_rope(
            qkv.data_ptr(), qkv.stride(0), rows, w.heads + w.kv_heads, w.head_dim, cos.data_ptr(), sin.data_ptr()
        )
        keys, values = self._keys[i], self._values[i]  # [KV, capacity, hd]
        k, v = qkv[:, q_size:].split(kv_size, dim=-1)
        keys[:, start : start + rows] = k.view(rows, w.kv_heads, w.head_dim).transpose(0, 1)
        values[:, start : start + rows] = v.view(rows, w.kv_heads, w.head_dim).transpose(0, 1)
        out = qkv.new_empty(rows, q_size)
        tree = (None, None) if layout.is_chain else (layout.offsets.data_ptr(), layout.visible.data_ptr())
        lib.ex_attention(
            qkv.data_ptr(), qkv.stride(0), keys.data_ptr(), values.data_ptr(), keys.shape[1], out.data_ptr(),
            rows, start, w.heads, w.kv_heads, w.head_dim, w.scale, scratch.data_ptr(), *tree,
        )  # fmt: skip
        return out


def load_exact_lm(directory: Path, cfg: dict, name: str, lib: ctypes.CDLL) -> ExactLM:
    """The exact model in ``directory`` (its ``config.json`` already read as ``cfg``)."""
    if cfg.get(ARITHMETIC_KEY) != ARITHMETIC_VERSION:
        raise PackedModelError(
            f"{directory}: arithmetic {cfg.get(ARITHMETIC_KEY)!r}; this build runs {ARITHMETIC_VERSION}"
        )
    if cfg.get("model_type") not in SUPPORTED:
        raise PackedModelError(f"exact models of type {cfg.get('model_type')!r} are not supported (only {SUPPORTED})")
    head_dim = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    if head_dim > MAX_HEAD_DIM or head_dim % 2:
        raise PackedModelError(f"a head of {head_dim} values: the exact kernel takes even widths up to {MAX_HEAD_DIM}")
    weights = ExactWeights(directory, cfg, lib)
    return ExactLM(weights, name, lib, int(cfg["vocab_size"]), int(cfg["max_position_embeddings"]), True)
