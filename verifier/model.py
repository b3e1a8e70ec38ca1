"""The small model interface the decode loops run on; the model knows nothing about sampling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class LanguageModel(Protocol):
    """A causal LM with an incremental KV cache that can be rolled back."""

    vocab_size: int

    def cached(self) -> Sequence[int]:
        """The tokens whose keys/values are in the cache, in order."""

    def extend(self, tokens: Sequence[int]) -> np.ndarray:  # -> [len(tokens), V] logits
        """Append ``tokens`` to the cache and return the logits at each appended position."""

    def rollback(self, n: int) -> None:
        """Drop the last ``n`` tokens from the cache."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def score(model: LanguageModel, context: Sequence[int], extra: Sequence[int] = ()) -> tuple[np.ndarray, int]:
    """Logits after ``context`` and after each token of ``extra`` ([len(extra)+1, V]), and the
    number of positions the model had to score for them (one forward pass, after ``uncached``)."""
    fresh = [*uncached(model, context), *extra]
    logits = model.extend(fresh)
    return logits[-(len(extra) + 1) :], len(fresh)


def uncached(model: LanguageModel, context: Sequence[int]) -> list[int]:
    """Roll ``model``'s cache back to its longest prefix shared with ``context`` (this is where
    rejected drafts leave the cache), keeping at least the last context token to re-score; the
    context tokens it must score next."""
    if not context:
        raise ValueError("score needs a non-empty context")
    cached = model.cached()
    keep = min(common_prefix(cached, context), len(context) - 1)
    model.rollback(len(cached) - keep)
    return list(context[keep:])
