"""An exact model directory served on the C kernel: the lean forward (node.model.kernels.llama)
with docs/exact-arithmetic.md's operations, a ``verifier.LanguageModel`` like every other target.

The directory (``convert.write_exact``) holds the GGUF as published, the RoPE tables made at
conversion, ``config.json`` naming the arithmetic, and the tokenizer. The products read the GGUF's
blocks from one memory map (no float16 copy is made), or, where the CPU has AVX-512 VNNI, their copy
repacked at load (kernel.PackedArena: the same blocks in exact_vnni.c's layout, instead of the map's
pages, not beside them); norms, RoPE, the KV cache's writes, attention, SiLU and the embedding's rows
(§10's formulas; other formats in torch) run ops.c; the residual and bias additions are single
binary32 additions. Every pass, prefill included, runs this one code path row by row, so a row's
logits never depend on the pass width or on the other jobs of a batched pass, and the operator,
plain decoding, a challenger and a referee compute the same bits (tests/test_exact_model.py checks
them against node.model.exact.reference).
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
from node.model.exact.kernel import TYPE_CODES, PackedArena, Part, matmul_parts
from node.model.exact.packed_store import store_dir
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
    """x · Wᵀ for one matrix or several (q, k and v; gate and up: their outputs side by side, their input
    quantized once where they are packed), each §3-4's product."""

    def __init__(self, parts: Sequence[Matrix], lib: ctypes.CDLL) -> None:
        self.parts, self._lib = list(parts), lib
        self.out_features = sum(p.n for p in parts)
        self.use([0] * len(self.parts))

    def use(self, packed: Sequence[int]) -> None:
        """Each part's packed copy from now on (its address; 0: the raw blocks only)."""
        self._calls = [Part(p.kind, p.raw.ctypes.data, a, p.n, p.k) for p, a in zip(self.parts, packed, strict=True)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, k] -> [M, Σn]
        return matmul_parts(self._lib, self._calls, x)


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
        self.gate_up = ExactLinear([gguf.matrix(b + f"ffn_{x}.weight") for x in ("gate", "up")], lib)  # [M, 2 I]
        self.down = ExactLinear([gguf.matrix(b + "ffn_down.weight")], lib)
        self.intermediate = self.gate_up.parts[0].n

    def linears(self) -> list[ExactLinear]:
        return [self.qkv, self.o, self.gate_up, self.down]


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
        self._embed, self._lib = gguf.matrix("token_embd.weight"), lib
        self.layers = [_ExactLayer(gguf, i, eps, lib) for i in range(int(cfg["num_hidden_layers"]))]
        self.norm = ExactRMSNorm(gguf.vector("output_norm.weight"), eps, lib)
        self.head = ExactLinear([gguf.matrix("output.weight")], lib)
        self._pack([linear for layer in self.layers for linear in layer.linears()] + [self.head], lib)
        self.cos, self.sin = _rope_tables(Path(directory) / files["rope"], int(cfg["max_position_embeddings"]), d)
        matrices = [t for t in gguf.tensors.values() if t.tensor_type.name in TYPES]
        self.parameter_count = sum(int(t.n_elements) for t in gguf.tensors.values())
        self.pass_bytes = sum(int(t.n_bytes) for t in matrices if t.name != "token_embd.weight")

    def _pack(self, linears: list[ExactLinear], lib: ctypes.CDLL) -> None:
        """Every K-quant matrix repacked once (where the kernel reads packed matrices), in one arena."""
        matrices = [(p.kind, p.raw.ctypes.data, p.n, p.k, p.raw.nbytes) for linear in linears for p in linear.parts]
        self.arena = PackedArena(lib, matrices, store_dir(self.directory))
        at = 0
        for linear in linears:
            linear.use(self.arena.addresses[at : at + len(linear.parts)])
            at += len(linear.parts)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [M] -> [M, d]: §10's dequantized rows
        e = self._embed
        if e.kind in ("Q4_K", "Q6_K"):  # ops.c's, the same formulas
            ids = ids.to(torch.int64).contiguous()
            out = torch.empty(ids.shape[0], e.k)
            code, raw = TYPE_CODES[e.kind], e.raw.ctypes.data
            if self._lib.ex_embed(code, raw, e.n, e.k, ids.data_ptr(), len(ids), out.data_ptr()):
                raise IndexError(f"a token id outside the embedding's {e.n} rows")
            return out
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
        width = layer.intermediate
        gate_up = layer.gate_up(layer.post_norm(hidden))  # [M, 2 I]: gate then up
        gated = gate_up.new_empty(gate_up.shape[0], width)
        up = gate_up.data_ptr() + 4 * width  # binary32
        self._lib.ex_silu_mul(gate_up.data_ptr(), up, gated.data_ptr(), gate_up.shape[0], width, 2 * width)
        return layer.down(gated)

    def attend(self, i, qkv, cos, sin, layout: RowLayout, scratch) -> torch.Tensor:  # qkv [M, q + 2 kv] -> [M, q]
        """Layer ``i``'s attention (§8-9): RoPE from the stored tables, the rows' keys and values into
        this cache, and each query row against what it sees of the cache."""
        w, rows, lib, start = self.weights, qkv.shape[0], self._lib, layout.start
        q_size = w.heads * w.head_dim
        cos, sin = cos.contiguous(), sin.contiguous()
        lib.ex_rope(
            qkv.data_ptr(), qkv.stride(0), rows, w.heads + w.kv_heads, w.head_dim, cos.data_ptr(), sin.data_ptr()
        )
        keys, values = self._keys[i], self._values[i]  # [KV, capacity, hd]
        lib.ex_store_kv(
            qkv.data_ptr(), qkv.stride(0), rows, q_size, w.kv_heads, w.head_dim, keys.data_ptr(), values.data_ptr(),
            keys.shape[1], start,
        )  # fmt: skip
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
