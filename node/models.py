"""Loading local Hugging Face model directories and adapting them to verifier.LanguageModel."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from node.pairs import CACHE_DIR, CONVERTED_MARKER, PAIRS, SETUP_COMMAND
from node.subvocab import is_subvocab_draft, load_subvocab_draft
from verifier.errors import ContextTooLong, ModelMismatch, SpecmarketError

log = logging.getLogger(__name__)

TINY_TARGET = PAIRS["tiny"].target
TINY_DRAFT = PAIRS["tiny"].draft


class ModelLoadError(SpecmarketError):
    """A model directory that is missing or not a loadable HF causal LM."""


class HFCausalLM:
    """A transformers causal LM with a DynamicCache that can be rolled back (transformers 5 API)."""

    def __init__(self, model, name: str = "model", kernel: str = "plain") -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.name = name
        self.kernel = kernel  # the linear-layer kernel in use (node.kernels)
        self.vocab_size = int(model.config.vocab_size)
        self.max_positions = int(getattr(model.config, "n_positions", 0) or model.config.max_position_embeddings)
        self._cache_cls = DynamicCache
        self.reset()

    def reset(self) -> None:
        self._cache = self._cache_cls(config=self.model.config)
        self._tokens: list[int] = []

    def cached(self) -> Sequence[int]:
        return self._tokens

    def extend(self, tokens: Sequence[int]) -> np.ndarray:  # -> [len(tokens), V] float32
        import torch

        if not tokens:
            raise ValueError("extend needs at least one token")
        if len(self._tokens) + len(tokens) > self.max_positions:
            raise ContextTooLong(
                f"{self.name}: {len(self._tokens) + len(tokens)} positions exceed the context window "
                f"of {self.max_positions}"
            )
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        with torch.inference_mode():
            out = self.model(input_ids=ids, cache=self._cache, use_cache=True)
        self._tokens.extend(int(t) for t in tokens)
        return out.logits[0].float().numpy()

    def rollback(self, n: int) -> None:
        if n < 0 or n > len(self._tokens):
            raise ValueError(f"cannot roll back {n} of {len(self._tokens)} cached tokens")
        if n:
            self._cache.crop(-n)  # transformers 5: a negative argument removes that many tokens
            del self._tokens[-n:]

    def fork(self) -> HFCausalLM:
        """Same weights, separate (empty) cache."""
        return HFCausalLM(self.model, self.name, self.kernel)


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 over the sorted vocabulary: equal fingerprints mean interchangeable token ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def load_model_dir(path: Path | str, name: str, kernel: str = "plain") -> tuple[HFCausalLM, object]:
    """Load a local HF model directory as fp32 with its tokenizer; ``kernel`` picks the linear-layer
    kernel (node.kernels: a speed choice, falling back to plain where it cannot run)."""
    import torch
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from node.kernels import load_kernel

    hf_logging.disable_progress_bar()  # loading a local 20 MB model needs no progress bar

    path = Path(path)
    hint = f" (it is prepared by `{SETUP_COMMAND}`)" if path.resolve().is_relative_to(CACHE_DIR) else ""
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{name} model directory {path} has no config.json (not a HF model directory?){hint}")
    try:
        if is_subvocab_draft(path):
            model = load_subvocab_draft(path)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, SafetensorError) as exc:
        raise ModelLoadError(f"cannot load {name} model from {path}: {exc}{hint}") from exc
    return load_kernel(model, name, kernel), tokenizer


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
    ``kernel`` is the linear-layer kernel of both (node.kernels)."""
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
    except a conversion's record (``CONVERTED_MARKER``), which describes the model and holds this hash."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"model directory {path} has no config.json")
    lines = []
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.name != CONVERTED_MARKER):
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
        lines.append(f"{file.relative_to(path).as_posix()} {digest}\n")
    return hashlib.sha256("".join(lines).encode()).digest()
