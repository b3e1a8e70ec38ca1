"""Exactness: the output distribution equals the target's, whatever the drafter does (docs/design.md §2).

Chi-square goodness of fit, fixed seeds, threshold p > 1e-3, and as many samples as catch a
deviation of Cohen's w = 0.1 with power 0.99 (tests/stats.py: 10,000 at T = 1, 6,500 with top-k).
Synthetic cases use a Markov LM whose exact joint distribution is known and run the full
speculative loop (drafting, rejections, bonus tokens, cache rollback) for 3 tokens with γ = 2.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.stats import check_fit, samples_for_power
from tests.synthetic import MarkovLM, perturbed, random_table
from verifier.decode import decode_speculative
from verifier.params import SamplingParams, token_probs
from verifier.proposers import AdversarialProposer, LocalDraftProposer, LyingProposer, RandomProposer
from verifier.verify import Rule

V = 5
N_TOKENS = 3
PROMPT = [0]
TABLE = random_table(V, seed=11)
DRAFT_TABLE = perturbed(TABLE, seed=12)
PARAM_CASES = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.8,top_k=3": SamplingParams(temperature=0.8, top_k=3),
}


def _proposer(name: str):
    return {
        "local": lambda: LocalDraftProposer(MarkovLM(DRAFT_TABLE)),
        "random": lambda: RandomProposer(V, rng_seed=5),
        "adversarial": lambda: AdversarialProposer(MarkovLM(TABLE)),
        "lying": lambda: LyingProposer(V, wanted=int(np.argmin(TABLE[0]))),
    }[name]()


def _joint_target_probs(params: SamplingParams) -> dict[tuple[int, ...], float]:
    cond = [token_probs(TABLE[prev], params) for prev in range(V)]
    probs = {}
    for seq in itertools.product(range(V), repeat=N_TOKENS):
        p, prev = 1.0, PROMPT[-1]
        for tok in seq:
            p *= cond[prev][tok]
            prev = tok
        probs[seq] = p
    return probs


def _sample(proposer_name: str, params: SamplingParams, rule: Rule, n: int) -> list[tuple[int, ...]]:
    target, proposer = MarkovLM(TABLE), _proposer(proposer_name)
    return [
        decode_speculative(
            target, proposer, PROMPT, params=params, seed=seed, max_new_tokens=N_TOKENS, gamma=2, rule=rule
        ).tokens
        for seed in range(n)
    ]


@pytest.mark.parametrize(
    "proposer_name,params_name",
    [
        ("local", "T=1"),
        ("random", "T=1"),
        ("adversarial", "T=1"),
        ("lying", "T=1"),
        ("local", "T=0.8,top_k=3"),
        ("lying", "T=0.8,top_k=3"),
    ],
)
def test_gumbel_is_exact_for_every_proposer(proposer_name, params_name):
    params = PARAM_CASES[params_name]
    expected = _joint_target_probs(params)
    samples = _sample(proposer_name, params, Rule.GUMBEL, samples_for_power(expected))
    check_fit(samples, expected, f"{proposer_name}/{params_name}")


@pytest.mark.parametrize("proposer_name", ["local", "random"])
def test_leviathan_is_exact_for_honest_proposers(proposer_name):
    params = PARAM_CASES["T=1"]
    expected = _joint_target_probs(params)
    samples = _sample(proposer_name, params, Rule.LEVIATHAN, samples_for_power(expected))
    check_fit(samples, expected, proposer_name)


def test_leviathan_is_forged_by_a_lying_proposer_but_gumbel_is_not():
    """docs/design.md §2: claiming q(x) = 1e-9 makes min(1, p/q) = 1, so the forced token always wins."""
    params = PARAM_CASES["T=1"]
    wanted = int(np.argmin(TABLE[0]))
    target_prob = token_probs(TABLE[0], params)[wanted]
    assert target_prob < 0.1
    forged = [s[0] for s in _sample("lying", params, Rule.LEVIATHAN, n=10_000)]
    honest = [s[0] for s in _sample("lying", params, Rule.GUMBEL, n=10_000)]
    forged_freq = forged.count(wanted) / len(forged)
    honest_freq = honest.count(wanted) / len(honest)
    assert forged_freq > 0.99, f"forced token frequency {forged_freq:.3f} (target prob {target_prob:.3f})"
    assert abs(honest_freq - target_prob) < 0.01, f"GUMBEL frequency {honest_freq:.3f} vs p {target_prob:.3f}"
