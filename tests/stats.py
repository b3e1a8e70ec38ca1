"""Chi-square goodness of fit with sparse bins merged (Cochran's rule: expected counts >= 5), and the
test's power, so every statistical test is sized by what it must catch rather than by habit.

Each test states its threshold and its power:

- threshold: H0 (the samples come from the target's distribution) is rejected at p < 1e-3;
- power: a deviation of Cohen's effect size ``w = sqrt(sum (p1 - p0)^2 / p0)`` of at least
  ``MIN_EFFECT`` is caught with probability at least ``POWER``. Under such an alternative the
  statistic is non-central chi-square with non-centrality ``n * w^2`` (Cohen 1988, "Statistical
  Power Analysis for the Behavioral Sciences", ch. 7), so the power follows from n and the bins.

``check_fit`` asserts both: a test whose sample could no longer catch that deviation fails, so a
shrunken sample cannot pass silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np
from scipy.stats import chi2, chisquare, ncx2

MIN_EXPECTED = 5.0
P_VALUE_THRESHOLD = 1e-3  # fixed seeds make every test deterministic; a correct sampler passes this
MIN_EFFECT = 0.1  # Cohen's w of the smallest deviation each exactness test must catch ("small", Cohen 1988)
POWER = 0.99  # the probability of catching a deviation of MIN_EFFECT at P_VALUE_THRESHOLD


def _binned(expected_probs: dict[Hashable, float], n: int) -> tuple[list[Hashable], bool]:
    """The outcomes with a bin of their own, and whether the rest get one too (False: they are too
    sparse for a bin of their own and fold into the last)."""
    big = [o for o, p in expected_probs.items() if p * n >= MIN_EXPECTED]
    rest = n - sum(expected_probs[o] * n for o in big)
    return big, rest >= MIN_EXPECTED


def chi_square_pvalue(samples: Sequence[Hashable], expected_probs: dict[Hashable, float]) -> float:
    """p-value of H0: ``samples`` are drawn from ``expected_probs`` (outcome -> probability)."""
    n = len(samples)
    counts = Counter(samples)
    unknown = set(counts) - {o for o, p in expected_probs.items() if p > 0}
    assert not unknown, f"sampled outcomes with zero target probability: {sorted(unknown)[:5]}"
    big, rest_bin = _binned(expected_probs, n)
    observed = [counts.get(o, 0) for o in big]
    expected = [expected_probs[o] * n for o in big]
    rest_expected, rest_observed = n - sum(expected), n - sum(observed)
    if rest_bin:
        observed.append(rest_observed)
        expected.append(rest_expected)
    else:
        observed[-1] += rest_observed
        expected[-1] += rest_expected
    return float(chisquare(np.array(observed), np.array(expected)).pvalue)


def power(n: int, expected_probs: dict[Hashable, float], effect: float = MIN_EFFECT) -> float:
    """The probability that ``n`` samples from a distribution at Cohen's w = ``effect`` from
    ``expected_probs`` give p < P_VALUE_THRESHOLD, with the bins ``chi_square_pvalue`` uses."""
    big, rest_bin = _binned(expected_probs, n)
    df = max(1, len(big) + rest_bin - 1)
    return float(ncx2.sf(chi2.isf(P_VALUE_THRESHOLD, df), df, n * effect**2))


def samples_for_power(expected_probs: dict[Hashable, float], effect: float = MIN_EFFECT, target: float = POWER) -> int:
    """The smallest sample size (in steps of 500) whose power reaches ``target``."""
    n = 500
    while power(n, expected_probs, effect) < target:
        n += 500
    return n


def check_fit(samples: Sequence[Hashable], expected_probs: dict[Hashable, float], label: str) -> None:
    """Assert that the sample is large enough to catch a deviation of MIN_EFFECT with POWER, and
    that it fits ``expected_probs`` (p > P_VALUE_THRESHOLD)."""
    reach = power(len(samples), expected_probs)
    assert reach >= POWER, f"{label}: {len(samples)} samples catch w = {MIN_EFFECT} with power {reach:.3f} only"
    pvalue = chi_square_pvalue(samples, expected_probs)
    assert pvalue > P_VALUE_THRESHOLD, f"{label}: chi-square p = {pvalue:.2e} ({len(samples)} samples)"
