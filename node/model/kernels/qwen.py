"""The lean forward (node.model.kernels.llama) over a packed Qwen2 model (node.model.packed).

Qwen2 is the Llama decoder with biases on q, k and v (Yang et al., "Qwen2 Technical Report",
2024); the qwen2.5-coder pair is two such models. Every weight comes from the model's one
memory-mapped ``weights.bin``: the products run the skinny kernel on the packed float16 weights
in place, the embedding is a float16 row lookup widened to fp32, and norms and biases are fp32.
Every pass, prefill included, runs the same kernel, so a row's logits never depend on the pass
width: the operator's prefill, its verification passes, a challenger's re-execution and a
referee's replay all compute the same bits on one code path.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from node.model.kernels.linear import PackedLinear
from node.model.kernels.llama import INITIAL_CAPACITY, LeanLM, RMSNorm
from node.model.packed import QUANT_BITS, SCALE_SUFFIX, PackedWeights

SUPPORTED = ("qwen2",)


def _linear(packed: PackedWeights, name: str, n: int, k: int, lib: ctypes.CDLL) -> PackedLinear:
    """The packed linear ``name`` [n, k]: float16, int8 with the row scales stored beside it, or a
    draft's 4-/5-bit groups."""
    scales = packed.tensor(name + SCALE_SUFFIX) if name + SCALE_SUFFIX in packed else None
    bits = QUANT_BITS.get(packed.entry(name).layout)
    return PackedLinear(packed.tensor(name), n, k, lib, scales, bits)


class _PackedLayer:
    """One decoder layer: the attributes the lean forward reads (llama._Layer's)."""

    def __init__(self, packed: PackedWeights, i: int, cfg: dict, lib: ctypes.CDLL) -> None:
        d, inter = cfg["hidden_size"], cfg["intermediate_size"]
        kv = cfg["num_key_value_heads"] * (d // cfg["num_attention_heads"])
        eps = float(cfg["rms_norm_eps"])
        base = f"model.layers.{i}."
        self.input_norm = RMSNorm(packed.tensor(base + "input_layernorm.weight"), eps, lib)
        self.post_norm = RMSNorm(packed.tensor(base + "post_attention_layernorm.weight"), eps, lib)
        self.qkv = _linear(packed, base + "self_attn.qkv_proj.weight", d + 2 * kv, d, lib)
        self.qkv_bias = packed.tensor(base + "self_attn.qkv_proj.bias")  # [d + 2 kv]
        self.o = _linear(packed, base + "self_attn.o_proj.weight", d, d, lib)
        self.gate_up = _linear(packed, base + "mlp.gate_up_proj.weight", 2 * inter, d, lib)
        self.down = _linear(packed, base + "mlp.down_proj.weight", d, inter, lib)
        self.intermediate = inter


class PackedQwenWeights:
    """What every job of one packed model shares: llama.LeanWeights' interface over the memory map."""

    def __init__(self, directory: Path, cfg: dict, lib: ctypes.CDLL) -> None:
        packed = PackedWeights(directory)
        self.directory = Path(directory)
        d = cfg["hidden_size"]
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = d // self.heads
        self.scale = self.head_dim**-0.5
        self._embed = packed.tensor("model.embed_tokens.weight")  # [V, d] float16
        self.layers = [_PackedLayer(packed, i, cfg, lib) for i in range(cfg["num_hidden_layers"])]
        self.norm = RMSNorm(packed.tensor("model.norm.weight"), float(cfg["rms_norm_eps"]), lib)
        self.head = _linear(packed, "lm_head.weight", cfg["vocab_size"], d, lib)
        self.theta = float(cfg["rope_theta"])
        self.parameter_count, self.pass_bytes = packed.parameter_count(), packed.pass_bytes()
        self._tables = (torch.empty(0, self.head_dim), torch.empty(0, self.head_dim))

    def embed(self, ids: torch.Tensor) -> torch.Tensor:  # [M] -> [M, d] fp32 (widening is exact)
        return self._embed[ids].float()

    def rotary(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:  # each [stop - start, head_dim]
        """RoPE tables as HF's default rotary embedding computes them (fp32: inv_freq = θ^(-2i/d),
        angle = position × inv_freq, one multiplication), for every position up to a doubling size."""
        cos, sin = self._tables
        if stop > cos.shape[0]:
            size = max(stop, 2 * cos.shape[0], INITIAL_CAPACITY)
            exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
            inv_freq = 1.0 / (self.theta**exponents)  # [hd / 2]
            angles = torch.arange(size).float()[:, None] * inv_freq[None, :]  # [size, hd / 2]
            table = torch.cat((angles, angles), dim=-1)
            cos, sin = table.cos(), table.sin()
            self._tables = (cos, sin)
        return cos[start:stop], sin[start:stop]


def load_packed_lm(directory: Path, cfg: dict, name: str, lib: ctypes.CDLL) -> LeanLM:
    """The packed model in ``directory`` (its ``config.json`` already read as ``cfg``) as a LeanLM."""
    if cfg.get("model_type") not in SUPPORTED:
        raise ValueError(f"packed models of type {cfg.get('model_type')!r} are not supported (only {SUPPORTED})")
    weights = PackedQwenWeights(directory, cfg, lib)
    max_positions = int(cfg["max_position_embeddings"])
    return LeanLM(weights, name, lib, int(cfg["vocab_size"]), max_positions, shape_invariant=True)
