"""A lean forward pass for Llama-architecture models (SmolLM2 and its draft), for short passes.

Hugging Face's ``LlamaForCausalLM`` forward is general: per call it builds masks and position
tensors, goes through a cache object and several module layers per decoder layer. On a
135M-parameter model that costs about as much as reading the weights (measured with the torch
profiler: docs/target-performance.md). This forward computes the same function with fewer,
larger steps, following gpt-fast's ``model.py`` (a plain decoder loop over preallocated caches):

- q, k and v are one product, and so are the MLP's gate and up (``SkinnyLinear`` over the
  concatenated weights: each output element is still its own dot product, so nothing changes);
- the KV cache is a preallocated tensor per layer that grows by doubling; a rollback is a length;
- RoPE's cos/sin come from the model's own rotary module, once, for every position up to the
  cache's size (the products inv_freq × position are single multiplications, as in HF's forward).

It reads the HF module's weights in place (nothing is copied but the kernel's packed layout), and
returns the same logits as ``HFCausalLM`` up to summation order (tests/test_kernels.py bounds the
difference far inside the tolerance band). The model knows nothing about sampling.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import torch

from node.model.adapter import context_limits
from node.model.kernels import LANES, SKINNY_MAX_ROWS
from node.model.kernels.linear import SkinnyLinear
from node.model.kernels.rows import ROOT, RowLayout, TreeShapeError
from verifier.errors import ContextTooLong

INITIAL_CAPACITY = 256  # cache positions allocated per job at first; doubled as needed


def is_lean_capable(model) -> bool:
    """A plain Llama decoder (no biases, default RoPE scaling handled by the model's rotary module)
    whose widths suit the kernel's 8-float lanes."""
    config = model.config
    heads = getattr(config, "num_attention_heads", 1)
    head_dim = getattr(config, "head_dim", None) or getattr(config, "hidden_size", 0) // heads
    return (
        getattr(config, "model_type", None) == "llama"
        and not getattr(config, "attention_bias", False)
        and not getattr(config, "mlp_bias", False)
        and config.hidden_size % LANES == 0
        and head_dim % (2 * LANES) == 0
    )


class RMSNorm:
    """HF's ``LlamaRMSNorm`` (w · (x · 1/√(mean(x²) + ε))) as one kernel call per pass, row by row."""

    def __init__(self, weight: torch.Tensor, eps: float, lib: ctypes.CDLL) -> None:  # weight [d] fp32
        self.weight, self.eps, self._lib = weight, eps, lib

    @classmethod
    def of(cls, norm, lib: ctypes.CDLL) -> RMSNorm:
        """The kernel's norm over a HF ``LlamaRMSNorm`` module's weight."""
        return cls(norm.weight.detach().contiguous(), float(norm.variance_epsilon), lib)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, d] -> [M, d]
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, width = x.shape
        self._lib.skinny_rms_norm(x.data_ptr(), self.weight.data_ptr(), out.data_ptr(), rows, width, self.eps)
        return out


class _Layer:
    """One decoder layer's weights, with the fused products."""

    def __init__(self, layer, lib: ctypes.CDLL, max_rows: int | None) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm = RMSNorm.of(layer.input_layernorm, lib)
        self.post_norm = RMSNorm.of(layer.post_attention_layernorm, lib)
        self.qkv = SkinnyLinear.fused([attn.q_proj, attn.k_proj, attn.v_proj], lib, max_rows)
        self.o = SkinnyLinear(attn.o_proj, lib, max_rows=max_rows)
        self.gate_up = SkinnyLinear.fused([mlp.gate_proj, mlp.up_proj], lib, max_rows)
        self.down = SkinnyLinear(mlp.down_proj, lib, max_rows=max_rows)
        self.intermediate = mlp.gate_proj.out_features
        self.qkv_bias = None  # Llama has none (is_lean_capable); Qwen2's packed layers do (kernels.qwen)


class LeanWeights:
    """What every job of one model shares: the layers, the rotary tables, the head."""

    def __init__(self, model, lib: ctypes.CDLL, max_rows: int | None = SKINNY_MAX_ROWS) -> None:
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = model.model.layers[0].self_attn.scaling
        self.embed = model.model.embed_tokens
        self.layers = [_Layer(layer, lib, max_rows) for layer in model.model.layers]
        self.norm = RMSNorm.of(model.model.norm, lib)
        self.head = _head(model.lm_head, lib, max_rows)
        self._rotary = model.model.rotary_emb
        self.parameter_count = sum(p.numel() for p in model.parameters())
        # (cos, sin), each [positions, head_dim]: one reference, replaced whole, so that jobs in other
        # worker threads always read a matching pair
        self._tables = (torch.empty(0, self.head_dim), torch.empty(0, self.head_dim))

    def rotary(self, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:  # each [stop - start, head_dim]
        cos, sin = self._tables
        if stop > cos.shape[0]:
            size = max(stop, 2 * cos.shape[0], INITIAL_CAPACITY)
            positions = torch.arange(size).unsqueeze(0)
            cos, sin = (t[0] for t in self._rotary(torch.empty(1, dtype=torch.float32), positions))
            self._tables = (cos, sin)
        return cos[start:stop], sin[start:stop]


class _SubVocabHead:
    """A sub-vocabulary head (node.model.subvocab) on the skinny kernel: scores its S tokens, FILL elsewhere."""

    def __init__(self, head, lib: ctypes.CDLL, max_rows: int | None) -> None:
        linear = torch.nn.Linear(head.weight.shape[1], head.weight.shape[0], bias=False)
        linear.weight = head.weight  # [S, d], shared
        self.scores, self.ids, self.vocab_size = SkinnyLinear(linear, lib, max_rows=max_rows), head.ids, head.vocab_size

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:  # [M, d] -> [M, V]
        from node.model.subvocab import FILL_LOGIT

        out = hidden.new_full((hidden.shape[0], self.vocab_size), FILL_LOGIT)
        out[:, self.ids] = self.scores(hidden)
        return out


def _head(head, lib: ctypes.CDLL, max_rows: int | None):
    """The LM head on the skinny kernel where it is a plain or a sub-vocabulary linear map."""
    if isinstance(head, torch.nn.Linear) and head.bias is None:
        return SkinnyLinear(head, lib, max_rows=max_rows)
    if hasattr(head, "ids") and isinstance(getattr(head, "weight", None), torch.Tensor):
        return _SubVocabHead(head, lib, max_rows)
    return head


class LeanLM:
    """The lean forward over shared ``weights`` (``LeanWeights`` here, or kernels.qwen's packed
    ones), with its own KV cache: a ``verifier.LanguageModel`` like ``HFCausalLM``."""

    kernel = "skinny"
    supports_trees = True  # extend_tree and keep_path (verifier.tree)

    def __init__(
        self, weights, name: str, lib: ctypes.CDLL, vocab_size: int, max_positions: int, shape_invariant: bool = False
    ) -> None:
        self._lib, self.weights, self.name = lib, weights, name
        self.vocab_size, self.max_positions = vocab_size, max_positions
        # every pass, a prefill of any width included, on the skinny kernel: a row's result never
        # depends on its pass (packed models); HF-weight models run wide passes on torch's kernel
        self.shape_invariant = shape_invariant
        self.reset()

    def reset(self) -> None:
        w = self.weights
        self._keys = [torch.empty(w.kv_heads, 0, w.head_dim) for _ in w.layers]
        self._values = [torch.empty(w.kv_heads, 0, w.head_dim) for _ in w.layers]
        self._tokens: list[int] = []
        self._tree: tuple[int, list[int]] | None = None  # (start, parents) of a tree not yet cut to a path

    def cached(self) -> Sequence[int]:
        self._drop_tree()
        return self._tokens

    def _drop_tree(self) -> None:
        """A tree that was not cut to a path (``keep_path``) keeps only its rows that sit where a chain's
        would (rows 0, 1, ... each the child of the one before); the rest leave the cache."""
        if self._tree is None:
            return
        start, parents = self._tree
        chain = next((m for m, parent in enumerate(parents) if parent != m - 1), len(parents))
        del self._tokens[start + chain :]
        self._tree = None

    def parameter_count(self) -> int:
        return self.weights.parameter_count

    def fork(self) -> LeanLM:
        """Same weights, separate (empty) cache."""
        return LeanLM(self.weights, self.name, self._lib, self.vocab_size, self.max_positions, self.shape_invariant)

    def fork_with_prefix(self, n: int) -> LeanLM:
        """A fork whose cache holds a copy of this cache's first ``n`` positions: their keys and values,
        bit for bit what a prefill of those tokens computes where the forward is ``shape_invariant``
        (a row's result never depends on the pass it is in). Prefix caching (vLLM's automatic prefix
        caching, SGLang's RadixAttention) without any change to what is computed."""
        if not 0 <= n <= len(self.cached()):
            raise ValueError(f"cannot copy {n} of {len(self._tokens)} cached positions")
        other = self.fork()
        if n:
            other.reserve(n)
            for mine, theirs in ((self._keys, other._keys), (self._values, other._values)):
                for source, target in zip(mine, theirs, strict=True):
                    target[:, :n] = source[:, :n]  # [KV, n, hd]
            other._tokens = list(self._tokens[:n])
        return other

    def rollback(self, n: int) -> None:
        self._drop_tree()
        if n < 0 or n > len(self._tokens):
            raise ValueError(f"cannot roll back {n} of {len(self._tokens)} cached tokens")
        if n:
            del self._tokens[-n:]  # the cache rows past len(self._tokens) are overwritten next

    def reserve(self, length: int) -> None:
        """Room in the cache for ``length`` positions in all (it grows by doubling)."""
        capacity = self._keys[0].shape[1]
        if length <= capacity:
            return
        size = max(length, 2 * capacity, INITIAL_CAPACITY)
        for cache in (self._keys, self._values):
            for i, old in enumerate(cache):
                grown = torch.empty(old.shape[0], size, old.shape[2])
                grown[:, : old.shape[1]] = old
                cache[i] = grown

    def extend(self, tokens: Sequence[int]) -> np.ndarray:  # -> [len(tokens), V] float32
        return self._extend(tokens, None)

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:  # -> [len(tokens), V]
        """Score a tree of rows in one pass (node.model.kernels.rows): row m follows row parents[m]
        (ROOT: the cache). Each row's logits are those of its path scored as a chain. The cache then
        holds every row until ``keep_path`` keeps one path and drops the rest."""
        return self._extend(tokens, parents)

    def _extend(self, tokens: Sequence[int], parents: Sequence[int] | None) -> np.ndarray:
        if not tokens:
            raise ValueError("extend needs at least one token")
        layout = self.layout(tokens, parents)
        self.reserve(layout.start + len(tokens))
        with torch.inference_mode():
            logits = self._forward(torch.tensor(list(tokens), dtype=torch.long), layout)
        self.record(tokens, parents)
        return logits.numpy()

    def layout(self, tokens: Sequence[int], parents: Sequence[int] | None) -> RowLayout:
        """Where ``tokens`` go in this cache (a chain without ``parents``); ContextTooLong past the window."""
        start = len(self.cached())
        if parents is not None and len(parents) != len(tokens):
            raise TreeShapeError(f"{len(parents)} parents for {len(tokens)} rows")
        layout = RowLayout.chain(start, len(tokens)) if parents is None else RowLayout.tree(start, parents)
        if (stop := start + max(layout.depths) + 1) > self.max_positions:
            raise ContextTooLong(f"{self.name}: {stop} positions exceed the context window of {self.max_positions}")
        return layout

    def record(self, tokens: Sequence[int], parents: Sequence[int] | None = None) -> None:
        """``tokens`` now occupy the cache's next positions (their keys and values are written); a
        tree's rows stay there, in row order, until ``keep_path``."""
        self._tree = None if parents is None else (len(self._tokens), list(parents))
        self._tokens.extend(int(t) for t in tokens)

    def keep_path(self, path: Sequence[int]) -> None:
        """After ``extend_tree``: keep the rows ``path`` (a root-first path of that tree) as the cache's
        next positions, in order, and drop every other row of the tree (their keys and values are
        overwritten by the next pass)."""
        if self._tree is None:
            raise TreeShapeError("keep_path follows extend_tree")
        start, parents = self._tree
        expected = ROOT
        for row in path:
            if not 0 <= row < len(parents) or parents[row] != expected:
                raise TreeShapeError(f"rows {list(path)} are not a root-first path of the tree")
            expected = row
        for depth, row in enumerate(path):
            if row != depth:  # rows on a chain from the root stay where they are
                for cache in (self._keys, self._values):
                    for layer in cache:
                        layer[:, start + depth] = layer[:, start + row]  # [KV, hd]
        tokens = self._tokens[start:]
        del self._tokens[start:]
        self._tokens.extend(tokens[row] for row in path)
        self._tree = None

    def _forward(self, ids: torch.Tensor, layout: RowLayout) -> torch.Tensor:  # ids [M] -> [M, V]
        w = self.weights
        hidden = w.embed(ids)  # [M, d]
        cos, sin = layout.rotary(w)
        scratch = torch.empty(layout.start + layout.rows)  # the attention weights of one query row
        for i, layer in enumerate(w.layers):
            qkv = self.qkv(layer, layer.input_norm(hidden))
            hidden = hidden + layer.o(self.attend(i, qkv, cos, sin, layout, scratch))
            hidden = hidden + self.mlp(layer, hidden)
        return w.head(w.norm(hidden)).float()

    @staticmethod
    def qkv(layer, x: torch.Tensor) -> torch.Tensor:  # x [M, d] -> [M, q_size + 2 kv_size]
        """The fused q, k, v product, with Qwen2's biases: row by row, so the pass width changes nothing."""
        qkv = layer.qkv(x).contiguous()
        if layer.qkv_bias is not None:
            qkv += layer.qkv_bias  # elementwise
        return qkv

    def mlp(self, layer, hidden: torch.Tensor) -> torch.Tensor:  # [M, d] -> [M, d]
        gate_up = layer.gate_up(layer.post_norm(hidden)).contiguous()  # [M, 2 I]: gate then up
        gated = hidden.new_empty(hidden.shape[0], layer.intermediate)
        self._lib.skinny_silu_mul(gate_up.data_ptr(), gated.data_ptr(), hidden.shape[0], layer.intermediate)
        return layer.down(gated)

    def attend(self, i, qkv, cos, sin, layout: RowLayout, scratch) -> torch.Tensor:  # qkv [M, q + 2 kv] -> [M, q]
        """Layer ``i``'s attention of this job's rows (``qkv``, placed by ``layout``): RoPE, the rows'
        keys and values into this cache, and each query row against what it sees of the cache."""
        w, rows, lib, start = self.weights, qkv.shape[0], self._lib, layout.start
        q_size, kv_size = w.heads * w.head_dim, w.kv_heads * w.head_dim
        # RoPE on q and k at once, in place; bit-identical to x·cos + rotate_half(x)·sin
        lib.skinny_rope(
            qkv.data_ptr(), qkv.stride(0), rows, w.heads + w.kv_heads, w.head_dim, cos.data_ptr(), sin.data_ptr()
        )
        keys, values = self._keys[i], self._values[i]  # [KV, capacity, hd]
        k, v = qkv[:, q_size:].split(kv_size, dim=-1)
        keys[:, start : start + rows] = k.view(rows, w.kv_heads, w.head_dim).transpose(0, 1)
        values[:, start : start + rows] = v.view(rows, w.kv_heads, w.head_dim).transpose(0, 1)
        out = qkv.new_empty(rows, q_size)
        common = (
            qkv.data_ptr(), qkv.stride(0), keys.data_ptr(), values.data_ptr(), keys.shape[1], out.data_ptr(),
            rows, start, w.heads, w.kv_heads, w.head_dim, w.scale, scratch.data_ptr(),
        )  # fmt: skip
        if layout.is_chain:
            lib.skinny_attention(*common)
        else:
            lib.skinny_tree_attention(*common, layout.offsets.data_ptr(), layout.visible.data_ptr())
        return out


class LeanLlamaLM(LeanLM):
    """A HF Llama model with the lean forward: ``HFCausalLM``'s interface, the same weights, own KV cache.
    ``shape_invariant``: every pass, a prefill of any width included, on the skinny kernel (as the
    packed models run), so a row's result never depends on its pass and jobs may share passes (for
    a small model: a wide pass on the kernel costs more than on torch's)."""

    def __init__(
        self, model, name: str, lib: ctypes.CDLL, weights: LeanWeights | None = None, shape_invariant: bool = False
    ) -> None:
        self.model = model.eval()
        vocab_size, max_positions = context_limits(model.config)
        weights = weights or LeanWeights(model, lib, None if shape_invariant else SKINNY_MAX_ROWS)
        super().__init__(weights, name, lib, vocab_size, max_positions, shape_invariant)

    def fork(self) -> LeanLlamaLM:
        return LeanLlamaLM(self.model, self.name, self._lib, self.weights, self.shape_invariant)
