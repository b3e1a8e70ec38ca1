"""The judge's tolerance (verifier/tolerance.py): float noise between the operator's machine and the
referee's never makes an honest token wrong, at any temperature and at top-k / top-p cut-offs, while
a genuinely wrong token is still caught.

The drift is simulated as a judge would see it: the operator samples from its logits z; the judge
recomputes z' = z + e with |e| ≤ DRIFT = 0.45 δ per logit (measured cross-shape drift on CPU
float32 is ≤ 1.1e-4 = 0.11 δ), in the worst direction for the claimed token (e = −DRIFT on it, +DRIFT
elsewhere) and in random directions. Each case runs on SEEDS fixed seeds.
"""

from __future__ import annotations

import numpy as np
import pytest

from verifier.errors import InvalidParams
from verifier.params import GREEDY_BELOW, SamplingParams, process_logits
from verifier.tolerance import TOLERANCE_DELTA, kept_bounds, shortfall, within_tolerance
from verifier.verify import noisy_scores, sample_token

DRIFT = 0.45 * TOLERANCE_DELTA
SEEDS = 300
VOCAB = 2000


def _logits(seed: int) -> np.ndarray:  # [V] a peaked distribution with a tail, and near-ties at the top
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, VOCAB)
    z[:4] = z.max() + np.array([1.0, 1.0 + 2e-4, 1.0 - 3e-4, 0.5])  # near-ties among the leaders
    return z


def _drifts(z: np.ndarray, token: int, seed: int) -> list[np.ndarray]:
    """The judge's logits: against the token, for it, and at random, each within DRIFT."""
    against = np.full(z.size, DRIFT)
    against[token] = -DRIFT
    rng = np.random.default_rng(seed + 10_000)
    return [z + against, z - against, z + rng.uniform(-DRIFT, DRIFT, z.size)]


def _honest_tokens_pass(z: np.ndarray, params: SamplingParams, seeds=range(SEEDS)) -> int:
    for seed in seeds:
        token = sample_token(z, params, seed, 3)
        for judged in _drifts(z, token, seed):
            assert within_tolerance(judged, params, seed, 3, token), (params, seed, token)
    return len(seeds)


PARAMS = [
    SamplingParams(temperature=1e-6),
    SamplingParams(temperature=1e-3),
    SamplingParams(temperature=0.05),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.05, top_k=3),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.9),
    SamplingParams(temperature=0.7, top_p=0.5),
]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_honest_token_under_drift_is_never_at_fault_succeeds(params):
    z = _logits(1)
    assert _honest_tokens_pass(z, params) == SEEDS


def test_tiny_temperatures_are_greedy_for_every_party_succeeds():
    z = _logits(2)
    for t in (1e-6, 1e-3, GREEDY_BELOW / 2):
        params = SamplingParams(temperature=t)
        assert params.greedy and np.array_equal(process_logits(z, params), z)
        assert {sample_token(z, params, seed, 0) for seed in range(50)} == {int(np.argmax(z))}
    assert not SamplingParams(temperature=GREEDY_BELOW).greedy


def _top_p_boundary(top_p: float) -> np.ndarray:
    """Logits whose third token starts 1e-7 before the cumulative probability reaches top_p: kept on
    the operator's machine, and kept or not on the judge's depending on noise far below the band."""
    probs = np.array([0.5, top_p - 0.5 - 1e-7, 0.06, 0.05, 0.04], dtype=np.float64)
    probs = np.concatenate([probs, np.full(VOCAB - probs.size, (1.0 - probs.sum()) / (VOCAB - probs.size))])
    return np.log(probs)


def test_honest_token_at_a_top_p_boundary_is_never_at_fault_succeeds():
    params = SamplingParams(temperature=1.0, top_p=0.8)
    z = _top_p_boundary(0.8)
    boundary_seeds = []
    for seed in range(4000):
        if sample_token(z, params, seed, 0) == 2:  # the operator kept and sampled the boundary token
            boundary_seeds.append(seed)
    assert len(boundary_seeds) >= 20, "the crafted boundary token should win often enough to test"
    for seed in boundary_seeds:
        for judged in _drifts(z, 2, seed):
            assert within_tolerance(judged, params, seed, 0, 2)
    possibly, surely = kept_bounds(z, params)
    assert possibly[2] and not surely[2]  # the boundary token is the ambiguous one, nothing else
    assert possibly[:2].all() and surely[:2].all() and not possibly[4:].any()


def test_honest_token_at_a_top_k_boundary_is_never_at_fault_succeeds():
    params = SamplingParams(temperature=0.5, top_k=2)
    z = np.full(VOCAB, -5.0)
    z[:3] = [2.0, 1.0, 1.0 - 1e-4]  # the 2nd and 3rd are tied within the noise: either may be kept
    for token in (1, 2):
        z_operator = z.copy()
        z_operator[3 - token] -= 2e-4  # on the operator's machine `token` is the one kept
        seeds = [s for s in range(2000) if sample_token(z_operator, params, s, 0) == token]
        assert len(seeds) >= 20
        for seed in seeds:
            for judged in _drifts(z_operator, token, seed):
                assert within_tolerance(judged, params, seed, 0, token)


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
def test_a_wrong_token_is_still_caught_succeeds(params):
    """The closest clearly wrong token (the best-scoring one that trails by more than 4 δ in logit
    units) is at fault under every drift; so is a token that top-k or top-p masks with room to spare."""
    z = _logits(3)
    for seed in range(SEEDS):
        order = np.argsort(-noisy_scores(z, params, seed, 3))[:20]
        wrong = next(int(t) for t in order if shortfall(z, params, seed, 3, int(t)) > 4 * TOLERANCE_DELTA)
        for judged in _drifts(z, wrong, seed):
            assert not within_tolerance(judged, params, seed, 3, wrong), (params, seed, wrong)
    if params.top_k or params.top_p < 1.0:
        masked = int(np.argmin(z))  # far below any cut-off
        assert shortfall(z, params, 0, 3, masked) == float("inf")
        assert not within_tolerance(z + DRIFT, params, 0, 3, masked)


def test_the_band_is_in_logit_units_succeeds():
    """A token δ/2 logits behind the best is inside the band at every temperature, one 2δ behind is
    outside: the band does not shrink as T falls, nor grow as T rises."""
    z = np.full(10, -20.0)
    z[0] = 0.0
    for t in (0.01, 0.05, 1.0, 5.0, 100.0):
        params = SamplingParams(temperature=t)
        seed = next(s for s in range(500) if sample_token(z, params, s, 0) == 0)
        g = noisy_scores(z, params, seed, 0) - z / t  # the Gumbel noise at this seed
        for behind, inside in ((TOLERANCE_DELTA / 2, True), (2 * TOLERANCE_DELTA, False)):
            claimed = z.copy()
            claimed[1] = z[0] + t * (g[0] - g[1]) - behind  # its noisy score `behind` logits below token 0's
            assert within_tolerance(claimed, params, seed, 0, 1) is inside, (t, behind)


def test_top_p_must_be_on_the_grid_reverts():
    for ok in (0.01, 0.5, 0.95, 1.0):
        SamplingParams(top_p=ok)
    for bad in (0.955, 0.333, 1e-4):
        with pytest.raises(InvalidParams, match=r"multiple of 0\.01"):
            SamplingParams(top_p=bad)
