"""A small qwen2 GGUF with seeded weights in every block format of the exact arithmetic, for tests:
the real target's layer in miniature (biases on q, k, v; GQA), with the shipped tiny pair's
tokenizer (4096 tokens), written by the ``gguf`` package's writer as a published GGUF would be."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from test_exact_recipes import random_blocks

from node.model.exact.blocks import TYPES
from node.model.pairs import MODELS_DIR

SEED = 7
SHAPE = dict(d=256, inter=512, layers=2, heads=4, kv_heads=2, vocab=4096, context=512)
# each matrix's block type, per layer: every format appears as a product, the embedding and the head
LAYER_TYPES = (
    {"attn_q": "Q4_K", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q6_K",
     "ffn_gate": "Q4_K", "ffn_up": "Q5_0", "ffn_down": "Q6_K"},
    {"attn_q": "Q8_0", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q5_0",
     "ffn_gate": "Q6_K", "ffn_up": "Q8_0", "ffn_down": "Q4_K"},
)  # fmt: skip
TOKENIZER_DIR = MODELS_DIR / "target"


def _matrix(
    writer: GGUFWriter, name: str, kind: str, n: int, k: int, rng: np.random.Generator, scale: float = 1.0
) -> None:
    raw = random_blocks(TYPES[kind], n, k, rng)
    if scale != 1.0:  # the blocks' binary16 scale d, shrunk (Q6_K keeps it at byte 208)
        at = {"Q8_0": 0, "Q5_0": 0, "Q4_K": 0, "Q6_K": 208}[kind]
        blocks = raw.reshape(n, -1, TYPES[kind].nbytes)
        d = blocks[..., at : at + 2].copy().view(np.float16).astype(np.float32) * scale
        blocks[..., at : at + 2] = d.astype(np.float16).view(np.uint8).reshape(*blocks.shape[:2], 2)
    writer.add_tensor(name, raw, raw_dtype=getattr(GGMLQuantizationType, kind))  # byte shape [n, bytes]


def _vector(writer: GGUFWriter, name: str, n: int, rng: np.random.Generator, around: float) -> None:
    writer.add_tensor(name, (around + 0.1 * rng.standard_normal(n)).astype(np.float32))


def write_seeded_gguf(path: Path, seed: int = SEED, head_scale: float = 1.0) -> Path:
    """A qwen2 GGUF of SHAPE at ``path`` with weights drawn from ``seed``; ``head_scale`` shrinks the
    output head's scales (and so the logits' spread)."""
    s, rng = SHAPE, np.random.default_rng(seed)
    d, hd = s["d"], s["d"] // s["heads"]
    kv = s["kv_heads"] * hd
    writer = GGUFWriter(str(path), "qwen2")
    writer.add_name("seeded exact test model")
    writer.add_context_length(s["context"])
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(s["inter"])
    writer.add_block_count(s["layers"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_token_list([f"t{i}" for i in range(s["vocab"])])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(0)
    _matrix(writer, "token_embd.weight", "Q8_0", s["vocab"], d, rng)
    for i, types in enumerate(LAYER_TYPES[: s["layers"]]):
        b = f"blk.{i}."
        for name, (n, k) in {"attn_q": (d, d), "attn_k": (kv, d), "attn_v": (kv, d), "attn_output": (d, d),
                             "ffn_gate": (s["inter"], d), "ffn_up": (s["inter"], d),
                             "ffn_down": (d, s["inter"])}.items():  # fmt: skip
            _matrix(writer, f"{b}{name}.weight", types[name], n, k, rng)
        for name, n in (("attn_q", d), ("attn_k", kv), ("attn_v", kv)):
            _vector(writer, f"{b}{name}.bias", n, rng, 0.0)
        _vector(writer, b + "attn_norm.weight", d, rng, 1.0)
        _vector(writer, b + "ffn_norm.weight", d, rng, 1.0)
    _vector(writer, "output_norm.weight", d, rng, 1.0)
    _matrix(writer, "output.weight", "Q6_K", s["vocab"], d, rng, head_scale)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
