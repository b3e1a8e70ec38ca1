"""Chi-square goodness of fit with sparse bins merged (Cochran's rule: expected counts >= 5)."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy.stats import chisquare

MIN_EXPECTED = 5.0
P_VALUE_THRESHOLD = 1e-3  # fixed seeds make every test deterministic; a correct sampler passes this


def chi_square_pvalue(samples, expected_probs: dict[object, float]) -> float:
    """p-value of H0: ``samples`` are drawn from ``expected_probs`` (outcome -> probability)."""
    n = len(samples)
    counts = Counter(samples)
    unknown = set(counts) - {o for o, p in expected_probs.items() if p > 0}
    assert not unknown, f"sampled outcomes with zero target probability: {sorted(unknown)[:5]}"
    big = [o for o, p in expected_probs.items() if p * n >= MIN_EXPECTED]
    observed = [counts.get(o, 0) for o in big]
    expected = [expected_probs[o] * n for o in big]
    rest_expected = n - sum(expected)
    rest_observed = n - sum(observed)
    if rest_expected >= MIN_EXPECTED:
        observed.append(rest_observed)
        expected.append(rest_expected)
    else:  # too sparse for a bin of its own: fold into the last bin
        observed[-1] += rest_observed
        expected[-1] += rest_expected
    return float(chisquare(np.array(observed), np.array(expected)).pvalue)
