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


class MarkovTreeLM(MarkovLM):
    """The Markov LM scoring trees of drafts (verifier.tree): a row's logits depend only on its own
    token, so a tree's rows need no attention mask; the cache keeps one path after ``keep_path``."""

    supports_trees = True

    def __init__(self, table: np.ndarray) -> None:
        super().__init__(table)
        self._tree_start: int | None = None
        self.tree_passes = 0

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:  # [n, V]
        assert len(parents) == len(tokens) and all(-1 <= p < m for m, p in enumerate(parents))
        self._tree_start, self.tree_passes = len(self._tokens), self.tree_passes + 1
        return self.extend(tokens)

    def keep_path(self, path: Sequence[int]) -> None:
        assert self._tree_start is not None, "keep_path follows extend_tree"
        rows = self._tokens[self._tree_start :]
        del self._tokens[self._tree_start :]
        self._tokens.extend(rows[m] for m in path)
        self._tree_start = None
