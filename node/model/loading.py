"""Loading local Hugging Face model directories as ``HFCausalLM`` (node.model.adapter) on the
linear-layer kernel asked for: this module chooses the kernel (``load_kernel``); the kernels
(node.model.kernels) know nothing of loading."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from node.model.adapter import HFCausalLM
from node.model.exact import is_exact_model
from node.model.hash_cache import compute_model_hash, sha256_file  # noqa: F401  (sha256_file: re-exported)
from node.model.kernels import KERNELS, KernelUnavailable, library
from node.model.packed import is_packed_model
from node.model.pairs import CACHE_DIR, CONVERTED_MARKER, PAIRS, SETUP_COMMAND
from node.model.subvocab import is_subvocab_draft, load_subvocab_draft
from verifier.errors import ModelMismatch, SpecmarketError

log = logging.getLogger(__name__)

TINY_TARGET = PAIRS["tiny"].target
TINY_DRAFT = PAIRS["tiny"].draft


class ModelLoadError(SpecmarketError):
    """A model directory that is missing or not a loadable HF causal LM."""


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 over the sorted vocabulary: equal fingerprints mean interchangeable token ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def load_model_dir(path: Path | str, name: str, kernel: str = "plain") -> tuple[HFCausalLM, object]:
    """Load a local HF model directory as fp32 with its tokenizer; ``kernel`` picks the linear-layer
    kernel (node.model.kernels: a speed choice, falling back to plain where it cannot run)."""
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loading a local 20 MB model needs no progress bar

    path = Path(path)
    hint = f" (it is prepared by `{SETUP_COMMAND}`)" if path.resolve().is_relative_to(CACHE_DIR) else ""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{name} model directory {path} has no config.json (not a HF model directory?){hint}")
    if is_exact_model(path):
        return load_exact_dir(path, name, hint)
    if is_packed_model(path):
        return load_packed_dir(path, name, kernel, hint)
    try:
        if is_subvocab_draft(path):
            model = load_subvocab_draft(path)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, SafetensorError) as exc:
        raise ModelLoadError(f"cannot load {name} model from {path}: {exc}{hint}") from exc
    return load_kernel(model, name, kernel), tokenizer


def load_packed_dir(path: Path, name: str, kernel: str, hint: str = "") -> tuple[HFCausalLM, object]:
    """A packed model (node.model.packed): memory-mapped weights on the skinny kernel, the only
    kernel that reads the packed layout (``kernel`` names the caller's wish; a CPU without the
    kernel cannot run such a model at all)."""
    from transformers import AutoTokenizer

    from node.model.kernels.qwen import load_packed_lm
    from node.model.packed import PackedModelError

    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    try:
        cfg = json.loads((path / "config.json").read_text())
        model = load_packed_lm(path, cfg, name, library())
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, PackedModelError, KernelUnavailable) as exc:
        raise ModelLoadError(f"cannot load {name} model from {path}: {exc}{hint}") from exc
    if kernel != "skinny":
        log.info("%s: a packed model runs the skinny kernel (asked for %s)", name, kernel)
    return model, tokenizer


def load_exact_dir(path: Path, name: str, hint: str = "") -> tuple[HFCausalLM, object]:
    """An exact model (node.model.exact): the GGUF's blocks in place on the exact kernel, whatever
    linear-layer kernel was asked for (the arithmetic is the model's, not a speed choice)."""
    from transformers import AutoTokenizer

    from node.model.exact.kernel import library as exact_library
    from node.model.exact.model import load_exact_lm
    from node.model.packed import PackedModelError

    try:
        cfg = json.loads((path / "config.json").read_text())
        model = load_exact_lm(path, cfg, name, exact_library())
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, PackedModelError, KernelUnavailable) as exc:
        raise ModelLoadError(f"cannot load {name} model from {path}: {exc}{hint}") from exc
    return model, tokenizer


def load_kernel(model, name: str, kernel: str) -> HFCausalLM:
    """``model`` (a HF causal LM) as an ``HFCausalLM`` running ``kernel``; the result's ``kernel``
    says what runs. ``skinny`` on a Llama model is the lean forward (node.model.kernels.llama),
    elsewhere the skinny linear layers in the HF forward. It falls back to ``plain``, with a
    warning, where it cannot run: the choice changes speed only, never the sampled distribution.
    """
    from node.model.kernels.linear import prepack_linears, use_skinny_linears

    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}")
    if kernel == "prepacked":
        prepack_linears(model)
    elif kernel == "skinny":
        try:
            lib = library()
        except KernelUnavailable as exc:
            log.warning("%s; using torch's kernel (plain) instead", exc)
            return HFCausalLM(model, name, "plain")
        from node.model.kernels.llama import LeanLlamaLM, is_lean_capable

        if is_lean_capable(model):
            return LeanLlamaLM(model, name, lib)
        use_skinny_linears(model, lib)
    return HFCausalLM(model, name, kernel)


@dataclass(frozen=True)
class ModelPair:
    target: HFCausalLM
    draft: HFCausalLM | None
    tokenizer: object
    fingerprint: str


def load_pair(
    target_dir: Path | str = TINY_TARGET, draft_dir: Path | str | None = TINY_DRAFT, kernel: str = "plain"
) -> ModelPair:
    """Load a target (and optionally a draft); a vocabulary mismatch is a ModelMismatch error.
    ``kernel`` is the linear-layer kernel of both (node.model.kernels)."""
    target, tokenizer = load_model_dir(target_dir, "target", kernel)
    fingerprint = tokenizer_fingerprint(tokenizer)
    draft = None
    if draft_dir is not None:
        draft, draft_tokenizer = load_model_dir(draft_dir, "draft", kernel)
        draft_fp = tokenizer_fingerprint(draft_tokenizer)
        if draft.vocab_size != target.vocab_size or draft_fp != fingerprint:
            raise ModelMismatch(
                f"draft {draft_dir} (vocab {draft.vocab_size}, tokenizer {draft_fp[:12]}) does not share "
                f"the target's vocabulary (vocab {target.vocab_size}, tokenizer {fingerprint[:12]})"
            )
    return ModelPair(target, draft, tokenizer, fingerprint)


def model_hash(path: Path | str) -> bytes:
    """The 32-byte model commitment an operator bonds and signs receipts for: sha256 over the sorted
    ``name sha256(file)`` lines of every file in the model directory (weights, config, tokenizer),
    except a conversion's record (``CONVERTED_MARKER``), which describes the model and holds this hash.
    Every file is read (node/model/hash_cache.py computes it, and caches it for clients)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json")
    return compute_model_hash(path)


def is_converted(out_dir: Path, gguf_sha256: str, quant: str | None = None) -> bool:
    """True when ``out_dir`` holds a complete conversion of this GGUF (at precision ``quant``, when
    given) whose files still hash to the model hash recorded at conversion (so a damaged directory,
    or one converted at another precision, is converted again)."""
    marker = out_dir / CONVERTED_MARKER
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("gguf_sha256") != gguf_sha256:
        return False
    if quant is not None and record.get("quant", "float16") != quant:
        return False
    return record.get("model_hash") == model_hash(out_dir).hex()
