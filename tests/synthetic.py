"""A tiny Markov-chain language model: a real LanguageModel whose exact distributions are known."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class MarkovLM:
    """Next-token logits depend only on the previous token: ``table[prev]``."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = np.asarray(table, dtype=np.float32)  # [V, V]
        self.vocab_size = self.table.shape[1]
        self._tokens: list[int] = []

    def cached(self) -> Sequence[int]:
        return self._tokens

    def extend(self, tokens: Sequence[int]) -> np.ndarray:  # [n, V]
        self._tokens.extend(tokens)
        return self.table[list(tokens)]

    def rollback(self, n: int) -> None:
        assert 0 <= n <= len(self._tokens)
        if n:
            del self._tokens[-n:]


def random_table(vocab: int, seed: int, scale: float = 1.5) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, scale, size=(vocab, vocab))


def perturbed(table: np.ndarray, seed: int, noise: float = 0.7) -> np.ndarray:
    """A 'draft' table: the target's logits plus noise (an imperfect but useful drafter)."""
    return table + np.random.default_rng(seed).normal(0.0, noise, size=table.shape)
