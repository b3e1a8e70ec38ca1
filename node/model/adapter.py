"""A Hugging Face causal LM as a ``verifier.LanguageModel``: the KV cache that rolls back."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verifier.errors import ContextTooLong


def context_limits(config) -> tuple[int, int]:
    """(vocabulary size, context window) of a HF model config."""
    return int(config.vocab_size), int(getattr(config, "n_positions", 0) or config.max_position_embeddings)


class HFCausalLM:
    """A transformers causal LM with a DynamicCache that can be rolled back (transformers 5 API)."""

    def __init__(self, model, name: str = "model", kernel: str = "plain") -> None:
        from transformers import DynamicCache

        self.model = model.eval()
        self.name = name
        self.kernel = kernel  # the linear-layer kernel in use (node.model.kernels)
        self.vocab_size, self.max_positions = context_limits(model.config)
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

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def fork(self) -> HFCausalLM:
        """Same weights, separate (empty) cache."""
        return HFCausalLM(self.model, self.name, self.kernel)
