"""Verification of drafted tokens: the GUMBEL rule (default) and the textbook LEVIATHAN rule.

Terms, defined once (after vLLM's rejection sampler):
- *draft tokens*: the γ tokens a proposer sends for positions start .. start+γ-1;
- *accepted tokens*: the longest prefix of the draft that the rule keeps;
- *recovered token*: the token emitted at the first rejected position;
- *bonus token*: the token emitted after all γ drafts were accepted, from the (γ+1)-th logits row.
A verdict is always ``accepted + [recovered or bonus]``, so ``len(tokens) == n_accepted + 1``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verifier.errors import InvalidParams, InvalidProposal
from verifier.noise import STREAM_ACCEPT, STREAM_GUMBEL, STREAM_RESIDUAL, gumbel, uniforms
from verifier.params import SamplingParams, process_logits, token_probs


class Rule(enum.Enum):
    GUMBEL = "gumbel"  # sample-and-match with shared Gumbel noise: exact for ANY drafter
    LEVIATHAN = "leviathan"  # min(1, p/q): exact only if the drafter reports q honestly


@dataclass(frozen=True)
class Verdict:
    tokens: tuple[int, ...]
    n_accepted: int


def noisy_scores(logits: np.ndarray, params: SamplingParams, seed: int, k: int) -> np.ndarray:
    """[V] float64 scores whose argmax is the sampled token at k (raw logits when greedy).

    For the target this gives y_k; an honest drafter applies it to its own logits to draft
    with the same noise (Daliri, Musco & Suresh 2024, drafter-invariant coupling).
    """
    return with_noise(process_logits(logits, params), params, seed, k)


def with_noise(processed: np.ndarray, params: SamplingParams, seed: int, k: int) -> np.ndarray:  # [V] -> [V]
    """``noisy_scores`` from logits already processed (``process_logits``): processed + G_k."""
    if params.greedy:
        return processed
    return processed + gumbel(seed, k, processed.size, STREAM_GUMBEL)


def sample_token(target_logits: np.ndarray, params: SamplingParams, seed: int, k: int) -> int:
    """y_k = argmax(processed_logits / T + G_k); an exact sample from the processed distribution."""
    return int(np.argmax(noisy_scores(target_logits, params, seed, k)))


def score_margin(target_logits: np.ndarray, params: SamplingParams, seed: int, k: int) -> float:
    """Gap between the best and second-best noisy score: how far position k is from a near-tie.
    (Judging a claimed token against float noise is ``verifier.tolerance``.)"""
    scores = np.sort(noisy_scores(target_logits, params, seed, k))
    return float(scores[-1] - scores[-2])


def _check_shapes(target_logits: np.ndarray, draft_tokens: Sequence[int], draft_probs) -> None:
    gamma = len(draft_tokens)
    if target_logits.ndim != 2 or target_logits.shape[0] != gamma + 1:
        raise InvalidParams(f"target_logits must be [γ+1, V] = [{gamma + 1}, V], got {target_logits.shape}")
    if draft_probs is not None and np.shape(draft_probs) != (gamma, target_logits.shape[1]):
        raise InvalidProposal(
            f"draft_probs must be [γ, V] = [{gamma}, {target_logits.shape[1]}], got {np.shape(draft_probs)}"
        )


def _verify_gumbel(target_logits, draft_tokens, params, seed, start) -> Verdict:
    accepted: list[int] = []
    for i, draft_token in enumerate(draft_tokens):
        target_token = sample_token(target_logits[i], params, seed, start + i)
        if draft_token != target_token:
            return Verdict((*accepted, target_token), i)  # recovered token
        accepted.append(draft_token)
    bonus = sample_token(target_logits[-1], params, seed, start + len(draft_tokens))
    return Verdict((*accepted, bonus), len(accepted))


def _sample_residual(target_probs: np.ndarray, draft_probs: np.ndarray, seed: int, k: int) -> int:
    residual = np.maximum(target_probs - draft_probs, 0.0)
    if residual.sum() <= 0.0:  # p == q up to rounding: rejection had probability ~0; fall back to p
        residual = target_probs
    with np.errstate(divide="ignore"):
        scores = np.log(residual) + gumbel(seed, k, residual.size, STREAM_RESIDUAL)
    return int(np.argmax(scores))


def _verify_leviathan(target_logits, draft_tokens, draft_probs, params, seed, start) -> Verdict:
    """Leviathan, Kalman & Matias (2023), "Fast Inference from Transformers via Speculative
    Decoding", Algorithm 1. Departures: the acceptance uniform r_k and the residual sample come
    from the counter PRF (streams STREAM_ACCEPT / STREAM_RESIDUAL keyed by (seed, k)) instead of a
    stateful RNG, so a receipt can be replayed; the bonus token uses the GUMBEL stream, so with
    γ = 0 this rule reduces to plain decoding.
    """
    accepted: list[int] = []
    for i, draft_token in enumerate(draft_tokens):
        k = start + i
        target_probs = token_probs(target_logits[i], params)  # [V]
        claimed_q = float(draft_probs[i][draft_token])
        r = uniforms(seed, k, 1, STREAM_ACCEPT)[0]
        if r * claimed_q < target_probs[draft_token]:  # r < min(1, p(x)/q(x)), without dividing
            accepted.append(draft_token)
            continue
        recovered = _sample_residual(target_probs, np.asarray(draft_probs[i], dtype=np.float64), seed, k)
        return Verdict((*accepted, recovered), i)
    bonus = sample_token(target_logits[-1], params, seed, start + len(draft_tokens))
    return Verdict((*accepted, bonus), len(accepted))


def verify(
    target_logits: np.ndarray,  # [γ+1, V] target logits at the γ draft positions plus one
    draft_tokens: Sequence[int],  # γ ints (γ may be 0)
    *,
    params: SamplingParams,
    seed: int,
    start: int,  # k of the first draft position
    rule: Rule = Rule.GUMBEL,
    draft_probs: np.ndarray | None = None,  # [γ, V], LEVIATHAN only
) -> Verdict:
    """Verify one block of drafted tokens against the target's logits (pure; no I/O)."""
    target_logits = np.asarray(target_logits)
    _check_shapes(target_logits, draft_tokens, draft_probs)
    if rule is Rule.GUMBEL:
        return _verify_gumbel(target_logits, draft_tokens, params, seed, start)
    if draft_probs is None:
        if draft_tokens:
            raise InvalidProposal("Rule.LEVIATHAN needs draft_probs for every draft token")
        draft_probs = np.zeros((0, target_logits.shape[1]))
    return _verify_leviathan(target_logits, draft_tokens, draft_probs, params, seed, start)
