"""The counter-based noise PRF: golden values pin the construction bit for bit (docs/design.md §2)."""

import math

import numpy as np
import pytest
from scipy.stats import gumbel_r, kstest

from verifier.errors import InvalidParams
from verifier.noise import STREAM_ACCEPT, STREAM_GUMBEL, gumbel, raw_words, uniforms

# Philox-4x64-10 raw words as produced by numpy.random.Philox(key=[seed, k], counter=[0,0,0,stream]).
GOLDEN_WORDS = {
    (0, 0, 0): [213000021201967259, 4455796210202625458, 2055444239878205049],
    (2**64 - 1, 7, 0): [1381310767821039646, 15666479065048238017],
}
GOLDEN_GUMBEL_0_0 = [-1.495451611576949, -0.351137118361487, -0.7859067841514995, 0.5586754626449683]
GOLDEN_GUMBEL_42_3_ACCEPT = [1.1542828763849315, -1.7764390093203437]


@pytest.mark.parametrize("key,words", GOLDEN_WORDS.items())
def test_raw_words_golden(key, words):
    seed, k, stream = key
    assert raw_words(seed, k, len(words), stream).tolist() == words


def test_uniform_and_gumbel_follow_documented_formula_exactly():
    words = GOLDEN_WORDS[(0, 0, 0)]
    # u = ((w >> 11) + 0.5) * 2^-53, then g = -log(-log(u)), recomputed with Python ints/floats
    expected_u = [((w >> 11) + 0.5) * 2.0**-53 for w in words]
    assert uniforms(0, 0, 3).tolist() == expected_u
    assert gumbel(0, 0, 3).tolist() == [-math.log(-math.log(u)) for u in expected_u]
    assert gumbel(0, 0, 4).tolist() == GOLDEN_GUMBEL_0_0
    assert gumbel(42, 3, 2, STREAM_ACCEPT).tolist() == GOLDEN_GUMBEL_42_3_ACCEPT


def test_prefix_stability_and_independence_of_keys():
    assert np.array_equal(gumbel(5, 9, 10), gumbel(5, 9, 100)[:10])  # V does not change the prefix
    assert not np.array_equal(gumbel(5, 9, 10), gumbel(5, 10, 10))
    assert not np.array_equal(gumbel(5, 9, 10), gumbel(6, 9, 10))
    assert not np.array_equal(gumbel(5, 9, 10, STREAM_GUMBEL), gumbel(5, 9, 10, STREAM_ACCEPT))


def test_uniforms_are_in_open_unit_interval():
    u = uniforms(123, 0, 200_000)
    assert u.min() > 0.0 and u.max() < 1.0


def test_gumbel_distribution_ks():
    # 200k draws across many keys; KS against the standard Gumbel, threshold p > 1e-3
    draws = np.concatenate([gumbel(seed, k, 1000) for seed in range(20) for k in range(10)])
    assert kstest(draws, gumbel_r.cdf).pvalue > 1e-3
    assert abs(draws.mean() - 0.5772156649) < 0.01  # Euler–Mascheroni constant


@pytest.mark.parametrize("seed,k", [(-1, 0), (0, -1), (2**64, 0), (0, 1.5), (True, 0)])
def test_bad_keys_are_rejected(seed, k):
    with pytest.raises(InvalidParams):
        gumbel(seed, k, 4)


def test_reused_generator_matches_a_freshly_constructed_philox():
    for seed, k, stream in [(0, 0, 0), (3, 99, 1), (2**64 - 1, 5, 2), (17, 2**63, 0)]:
        fresh = np.random.Philox(
            key=np.array([seed, k], dtype=np.uint64), counter=np.array([0, 0, 0, stream], dtype=np.uint64)
        ).random_raw(37)
        assert np.array_equal(raw_words(seed, k, 37, stream), fresh)
