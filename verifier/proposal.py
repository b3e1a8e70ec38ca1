"""Draft proposals and their validation. Nothing a proposer returns is trusted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verifier.errors import InvalidProposal

MAX_GAMMA = 16  # longest draft block accepted from any proposer (and the wire protocol's bound)
DEFAULT_GAMMA = 4  # draft tokens per round unless configured
# the most draft tokens a round of the target verifies (and `generate`'s default, so both decode
# alike): chosen by `specmarket bench-draft-length` on measured traces (docs/target-performance.md)
TARGET_GAMMA = 6
PROB_SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Proposal:
    tokens: tuple[int, ...]  # γ' <= γ draft tokens
    probs: np.ndarray | None = None  # [γ', V] claimed draft distributions; LEVIATHAN only
    # [γ'] the draft's own probability of each token, softmax at T = 1 when greedy: a drafter-side
    # hint for ending a block early (node.drafter.session); never sent, never trusted by a target
    confidence: tuple[float, ...] | None = None


EMPTY = Proposal(())


def _check_tokens(tokens: object, gamma: int, vocab_size: int) -> tuple[int, ...]:
    if not isinstance(tokens, (tuple, list)):
        raise InvalidProposal(f"draft tokens must be a list of ints, got {type(tokens).__name__}")
    if len(tokens) > gamma:
        raise InvalidProposal(f"{len(tokens)} draft tokens exceed γ = {gamma}")
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise InvalidProposal(f"draft token {t!r} is not an integer")
        if not 0 <= int(t) < vocab_size:
            raise InvalidProposal(f"draft token {int(t)} outside the vocabulary [0, {vocab_size})")
    return tuple(int(t) for t in tokens)


def _check_probs(probs: object, tokens: tuple[int, ...], vocab_size: int) -> np.ndarray:
    if not isinstance(probs, np.ndarray) or probs.dtype.kind != "f":
        raise InvalidProposal("LEVIATHAN needs draft probabilities as a float array")
    if probs.shape != (len(tokens), vocab_size):
        raise InvalidProposal(f"draft probs shape {probs.shape} != ({len(tokens)}, {vocab_size})")
    probs = probs.astype(np.float64)
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise InvalidProposal("draft probs must be finite and non-negative")
    if tokens and np.max(np.abs(probs.sum(axis=1) - 1.0)) > PROB_SUM_TOLERANCE:
        raise InvalidProposal("each row of draft probs must sum to 1")
    for i, t in enumerate(tokens):
        if probs[i, t] <= 0.0:
            raise InvalidProposal(f"draft token {t} at offset {i} has claimed probability 0")
    return probs


def validate_proposal(raw: object, *, gamma: int, vocab_size: int, need_probs: bool) -> Proposal:
    """Return a clean Proposal or raise InvalidProposal saying exactly what is wrong."""
    if not isinstance(raw, Proposal):
        raise InvalidProposal(f"expected a Proposal, got {type(raw).__name__}")
    tokens = _check_tokens(raw.tokens, gamma, vocab_size)
    probs = _check_probs(raw.probs, tokens, vocab_size) if need_probs else None
    return Proposal(tokens, probs)
