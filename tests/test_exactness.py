"""Exactness: the output distribution equals the target's, whatever the drafter does (docs/design.md §2).

Chi-square goodness of fit, fixed seeds, 50,000 samples per case, threshold p > 1e-3
(tests/stats.py). Synthetic cases use a Markov LM whose exact joint distribution is known and run the
full speculative loop (drafting, rejections, bonus tokens, cache rollback) for 3 tokens with γ = 2.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.stats import P_VALUE_THRESHOLD, chi_square_pvalue
from tests.synthetic import MarkovLM, perturbed, random_table
from verifier.decode import decode_speculative
from verifier.params import SamplingParams, token_probs
from verifier.proposers import AdversarialProposer, LocalDraftProposer, LyingProposer, RandomProposer
from verifier.verify import Rule

N_SAMPLES = 50_000
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


def _sample(proposer_name: str, params: SamplingParams, rule: Rule, n: int = N_SAMPLES) -> list[tuple[int, ...]]:
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
    samples = _sample(proposer_name, params, Rule.GUMBEL)
    pvalue = chi_square_pvalue(samples, _joint_target_probs(params))
    assert pvalue > P_VALUE_THRESHOLD, f"{proposer_name}/{params_name}: chi-square p = {pvalue:.2e}"


@pytest.mark.parametrize("proposer_name", ["local", "random"])
def test_leviathan_is_exact_for_honest_proposers(proposer_name):
    params = PARAM_CASES["T=1"]
    samples = _sample(proposer_name, params, Rule.LEVIATHAN)
    pvalue = chi_square_pvalue(samples, _joint_target_probs(params))
    assert pvalue > P_VALUE_THRESHOLD, f"{proposer_name}: chi-square p = {pvalue:.2e}"


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
