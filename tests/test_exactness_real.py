"""Exactness on real next-token distributions of the shipped target (GUMBEL, every proposer).

The first emitted token of a one-draft round is drawn under each proposer, for as many seeds as
catch a deviation of Cohen's w = 0.1 with power 0.99 (tests/stats.py: 18,000 at T = 1, 13,000 at
T = 0.8, top_p = 0.95); its distribution must match the target's processed next-token
distribution (chi-square, p > 1e-3).
The LEVIATHAN forgery is shown on the same real distribution.
"""

from __future__ import annotations

import numpy as np
import pytest

from node.model.decoding import encode_prompt
from tests.stats import check_fit, samples_for_power
from verifier.model import score
from verifier.params import SamplingParams, token_probs
from verifier.proposers import LYING_CLAIMED_PROB, LyingProposer
from verifier.verify import Rule, noisy_scores, verify

PROMPT = "def read_config(path):\n    with open(path) as f:\n        "
CASES = {
    "T=1": SamplingParams(temperature=1.0),
    "T=0.8,top_p=0.95": SamplingParams(temperature=0.8, top_p=0.95),
}


@pytest.fixture(scope="module")
def next_token_logits(pair):
    ids = encode_prompt(pair.tokenizer, PROMPT)
    pair.target.reset()
    pair.draft.reset()
    target_logits = score(pair.target, ids)[0][-1].astype(np.float64)  # [V]
    draft_logits = score(pair.draft, ids)[0][-1].astype(np.float64)  # [V]
    return target_logits, draft_logits


def _draft_token(name: str, seed: int, target_logits, draft_logits, params, rng, wanted: int) -> int:
    if name == "local":  # honest coupled draft with the same Gumbel noise
        return int(np.argmax(noisy_scores(draft_logits, params, seed, 0)))
    if name == "random":
        return int(rng.integers(target_logits.size))
    if name == "adversarial":
        return int(np.argmin(target_logits))
    return wanted  # lying


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["local", "random", "adversarial", "lying"])
def test_first_token_matches_target_distribution(name, case, next_token_logits):
    target_logits, draft_logits = next_token_logits
    params = CASES[case]
    probs = token_probs(target_logits, params)
    expected = dict(enumerate(probs))
    wanted = int(np.argsort(probs)[-20])  # a plausible but unlikely token to force
    rows = np.stack([target_logits, target_logits])  # [γ+1, V]; the bonus row is not examined
    rng = np.random.default_rng(0)
    firsts = [
        verify(
            rows,
            [_draft_token(name, seed, target_logits, draft_logits, params, rng, wanted)],
            params=params,
            seed=seed,
            start=0,
        ).tokens[0]
        for seed in range(samples_for_power(expected))
    ]
    check_fit(firsts, expected, f"{name}/{case}")


def test_leviathan_forgery_on_real_distribution(next_token_logits, pair):
    target_logits, _ = next_token_logits
    params = CASES["T=1"]
    probs = token_probs(target_logits, params)
    wanted = int(np.argsort(probs)[-50])
    liar = LyingProposer(target_logits.size, wanted)
    rows = np.stack([target_logits, target_logits])
    firsts = [
        verify(
            rows, [wanted], params=params, seed=seed, start=0, rule=Rule.LEVIATHAN, draft_probs=liar.claimed_probs(1)
        ).tokens[0]
        for seed in range(5_000)
    ]
    freq = firsts.count(wanted) / len(firsts)
    assert probs[wanted] > LYING_CLAIMED_PROB  # so min(1, p/q) = 1
    assert probs[wanted] < 0.05 and freq > 0.99, f"forced {freq:.3f} vs target probability {probs[wanted]:.4f}"
