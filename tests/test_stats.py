"""The statistical tests' own yardstick (tests/stats.py): at the sample size ``samples_for_power``
chooses, a distribution at Cohen's w = MIN_EFFECT from the target is rejected about POWER of the
time, and the target itself about P_VALUE_THRESHOLD of the time. Checked by simulation, with fixed
seeds: 300 replicates each, so a power of 0.99 shows as at least 0.96 (more than 3 standard
errors below it is a formula that is wrong, not noise)."""

from __future__ import annotations

import numpy as np

from tests.stats import MIN_EFFECT, P_VALUE_THRESHOLD, POWER, chi_square_pvalue, samples_for_power

REPLICATES = 300
MIN_OBSERVED_POWER = 0.96  # POWER 0.99 less 3 standard errors of 300 replicates (0.0057 each)
MAX_FALSE_ALARMS = 3  # of 300 replicates under H0 (expected 0.3 at 1e-3)


def _target(outcomes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(outcomes, 20.0))  # no outcome near zero


def _at_effect(target: np.ndarray, effect: float, seed: int) -> np.ndarray:
    """A distribution at Cohen's w = ``effect`` from ``target``: p1 = p0 + w·sqrt(p0)·u, with u a unit
    vector orthogonal to sqrt(p0) (so p1 sums to one), scaled down until every p1 is positive."""
    root = np.sqrt(target)
    u = np.random.default_rng(seed).standard_normal(target.size)
    u -= (u @ root) * root
    u /= np.linalg.norm(u)
    shifted = target + effect * root * u
    assert (shifted > 0).all(), "choose a smoother target"
    w = np.sqrt(np.sum((shifted - target) ** 2 / target))
    assert abs(w - effect) < 1e-9
    return shifted


def _rejections(target: np.ndarray, source: np.ndarray, n: int) -> int:
    rng = np.random.default_rng(7)
    expected = dict(enumerate(target))
    rejected = 0
    for _ in range(REPLICATES):
        samples = np.repeat(np.arange(target.size), rng.multinomial(n, source)).tolist()
        rejected += chi_square_pvalue(samples, expected) < P_VALUE_THRESHOLD
    return rejected


def test_a_deviation_of_the_minimum_effect_is_caught_with_the_stated_power_succeeds():
    target = _target(40, seed=3)
    n = samples_for_power(dict(enumerate(target)))
    caught = _rejections(target, _at_effect(target, MIN_EFFECT, seed=4), n)
    assert caught / REPLICATES >= MIN_OBSERVED_POWER, f"{caught}/{REPLICATES} caught at n = {n} (power {POWER})"


def test_the_target_itself_is_rarely_rejected_succeeds():
    target = _target(40, seed=3)
    n = samples_for_power(dict(enumerate(target)))
    assert _rejections(target, target, n) <= MAX_FALSE_ALARMS


def test_a_smaller_sample_has_less_power_reverts():
    """Half the chosen sample misses the minimum effect often: the power is not met by any size."""
    target = _target(40, seed=3)
    n = samples_for_power(dict(enumerate(target))) // 2
    caught = _rejections(target, _at_effect(target, MIN_EFFECT, seed=4), n)
    assert caught / REPLICATES < MIN_OBSERVED_POWER
