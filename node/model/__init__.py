"""The model pair every role runs: which directories a named pair is (``pairs``), loading them on
a linear-layer kernel (``loading``) as the KV-cache adapter ``HFCausalLM`` (``adapter``), the
sub-vocabulary draft head (``subvocab``), the kernels themselves (``kernels``), and local decoding
on a pair (``decoding``: prompt encoding, the context check, the built-in drafters, `generate`).

The kernels know nothing of loading; loading chooses the kernel (tests/test_layout.py enforces it).
Names are imported on first use, so reading ``PAIRS`` or ``KERNELS`` loads neither torch nor
transformers.
"""

from verifier.exports import lazy_exports

EXPORTS = {
    "node.model.adapter": ("HFCausalLM",),
    "node.model.decoding": (
        "DRAFTERS",
        "GenerateConfig",
        "check_fits",
        "encode_prompt",
        "generate",
        "lying_wanted_token",
        "pair_proposer",
        "run_decode",
    ),
    "node.model.kernels": ("DEFAULT_KERNEL", "KERNELS", "KernelUnavailable"),
    "node.model.loading": (
        "ModelLoadError",
        "ModelPair",
        "load_kernel",
        "load_model_dir",
        "load_pair",
        "model_hash",
        "tokenizer_fingerprint",
    ),
    "node.model.pairs": (
        "DEFAULT_PAIR",
        "MODELS_DIR",
        "PAIRS",
        "SMOLLM2_TARGET_DIR",
        "ModelNotPrepared",
        "Pair",
        "check_prepared",
        "get_pair",
    ),
    "node.model.subvocab": ("DraftLoadError", "FILL_LOGIT", "is_subvocab_draft", "load_subvocab_draft"),
}
__getattr__, __all__ = lazy_exports(__name__, EXPORTS)
