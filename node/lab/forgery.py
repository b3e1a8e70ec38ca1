"""The forgery row of the report: what a lying drafter does to the output distribution.

docs/design.md §2: under the textbook rule (Leviathan, Kalman & Matias 2023, Algorithm 1) a drafter that
claims q(x) = 1e-9 for its token x gets it accepted with probability min(1, p(x)/q(x)) = 1, so it
chooses the output. Under GUMBEL (sample-and-match) the drafter's claim is never read: the target
samples y_k itself and only a draft equal to y_k is kept.

This measures it on the shipped target model: the distribution of the first output token after a
prompt over ``n`` seeds, under each rule with the same lying drafter, as a total-variation distance
from the target's own distribution. The sampling-noise floor (the distance of ``n`` exact samples
drawn directly from the target distribution) is measured alongside, with a fixed seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from verifier.model import LanguageModel, score
from verifier.params import SamplingParams, token_probs
from verifier.proposers import LyingProposer
from verifier.verify import Rule, verify

MIN_WANTED_PROB = 1e-6  # the lying drafter pushes the least likely token the target still allows this much
NOISE_FLOOR_SEED = 0


@dataclass(frozen=True)
class ForgeryResult:
    samples: int
    wanted_token: int
    wanted_text: str
    target_prob: float  # p(wanted) under the target at this position
    textbook_freq: float  # how often the textbook rule emitted the wanted token
    gumbel_freq: float  # how often GUMBEL emitted it
    textbook_tv: float  # total-variation distance of the emitted-token histogram from the target's
    gumbel_tv: float
    noise_floor_tv: float  # the same distance for exact samples from the target distribution

    def to_dict(self) -> dict:
        return asdict(self)


def tv_distance(counts: np.ndarray, probs: np.ndarray) -> float:  # counts [V] ints, probs [V]
    """Total-variation distance between an empirical histogram and a distribution."""
    return 0.5 * float(np.abs(counts / counts.sum() - probs).sum())


def _wanted_token(target_probs: np.ndarray) -> int:  # [V]
    allowed = np.flatnonzero(target_probs >= MIN_WANTED_PROB)
    return int(allowed[np.argmin(target_probs[allowed])])


def first_token_counts(
    target_logits: np.ndarray,  # [2, V] after the prompt, and after the prompt + the wanted token
    liar: LyingProposer,
    params: SamplingParams,
    rule: Rule,
    seeds: range,
) -> np.ndarray:  # [V] how often each token came out first
    counts = np.zeros(target_logits.shape[1], dtype=np.int64)
    for seed in seeds:
        draft = liar.propose((), start=0, gamma=1, params=params, seed=seed)
        verdict = verify(
            target_logits, draft.tokens, params=params, seed=seed, start=0, rule=rule, draft_probs=draft.probs
        )
        counts[verdict.tokens[0]] += 1
    return counts


def measure_forgery(
    target: LanguageModel, tokenizer, prompt: Sequence[int], params: SamplingParams, samples: int
) -> ForgeryResult:
    """Both rules against the same lying drafter, ``samples`` seeds each (one target forward pass)."""
    target_probs = token_probs(score(target, prompt)[0][0], params)  # [V]
    wanted = _wanted_token(target_probs)
    target_logits = score(target, prompt, (wanted,))[0]  # [2, V]
    liar = LyingProposer(target_probs.size, wanted)
    seeds = range(samples)
    textbook = first_token_counts(target_logits, liar, params, Rule.LEVIATHAN, seeds)
    gumbel = first_token_counts(target_logits, liar, params, Rule.GUMBEL, seeds)
    exact = np.bincount(
        np.random.default_rng(NOISE_FLOOR_SEED).choice(target_probs.size, samples, p=target_probs),
        minlength=target_probs.size,
    )
    return ForgeryResult(
        samples=samples,
        wanted_token=wanted,
        wanted_text=tokenizer.decode([wanted]),
        target_prob=float(target_probs[wanted]),
        textbook_freq=float(textbook[wanted] / samples),
        gumbel_freq=float(gumbel[wanted] / samples),
        textbook_tv=tv_distance(textbook, target_probs),
        gumbel_tv=tv_distance(gumbel, target_probs),
        noise_floor_tv=tv_distance(exact, target_probs),
    )
