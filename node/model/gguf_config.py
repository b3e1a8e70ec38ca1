"""The HF-style config of a qwen2 GGUF's metadata: the shape both conversions (packed float16 and
exact) write into their model directories."""

from __future__ import annotations

from verifier.errors import SpecmarketError


class GgufFormatError(SpecmarketError):
    """A GGUF that is not a qwen2 model."""


def gguf_config(reader) -> dict:
    """The HF-style Qwen2 config of a qwen2 GGUF's metadata."""

    def field(key: str):
        return reader.fields[key].contents()

    if field("general.architecture") != "qwen2":
        raise GgufFormatError(f"expected a qwen2 GGUF, got {field('general.architecture')!r}")
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    return {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": int(field("qwen2.embedding_length")),
        "intermediate_size": int(field("qwen2.feed_forward_length")),
        "num_hidden_layers": int(field("qwen2.block_count")),
        "num_attention_heads": int(field("qwen2.attention.head_count")),
        "num_key_value_heads": int(field("qwen2.attention.head_count_kv")),
        "rms_norm_eps": float(field("qwen2.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field("qwen2.rope.freq_base")),
        "max_position_embeddings": int(field("qwen2.context_length")),
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "bos_token_id": int(field("tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field("tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float16",
        "specmarket_packed": True,
        "source": str(field("general.name")),
    }
