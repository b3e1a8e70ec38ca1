import numpy as np
import pytest

from verifier.errors import InvalidParams, SpecmarketError
from verifier.params import TOP_P_CANDIDATES, SamplingParams, process_logits, softmax, token_probs


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"temperature": 1000.0},
        {"temperature": "hot"},
        {"top_k": -1},
        {"top_k": 2.5},
        {"top_k": True},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_p": -0.2},
    ],
)
def test_sampling_params_rejects_bad_values(kwargs):
    with pytest.raises(InvalidParams) as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, SpecmarketError)
    assert next(iter(kwargs)) in str(info.value)


def test_sampling_params_defaults_are_plain_sampling():
    p = SamplingParams()
    assert (p.temperature, p.top_k, p.top_p) == (1.0, 0, 1.0)
    assert not p.greedy and SamplingParams(temperature=0).greedy


def test_top_k_keeps_exactly_the_k_largest():
    logits = np.array([0.1, 3.0, -1.0, 2.0, 0.5])
    out = process_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert np.isfinite(out).tolist() == [False, True, False, True, False]


def test_top_p_keeps_shortest_prefix_reaching_mass():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs)
    kept = np.isfinite(process_logits(logits, SamplingParams(temperature=1.0, top_p=0.75)))
    assert kept.tolist() == [True, True, False, False]
    kept = np.isfinite(process_logits(logits, SamplingParams(temperature=1.0, top_p=0.81)))
    assert kept.tolist() == [True, True, True, False]
    kept = np.isfinite(process_logits(logits, SamplingParams(temperature=1.0, top_p=0.1)))
    assert kept.tolist() == [True, False, False, False]


def test_temperature_scales_and_probs_normalise():
    logits = np.array([1.0, 2.0, 3.0])
    probs = token_probs(logits, SamplingParams(temperature=0.5))
    expected = np.exp(logits / 0.5) / np.exp(logits / 0.5).sum()
    np.testing.assert_allclose(probs, expected)
    greedy = token_probs(logits, SamplingParams(temperature=0.0))
    assert greedy.tolist() == [0.0, 0.0, 1.0]


def test_process_logits_rejects_matrices():
    with pytest.raises(InvalidParams):
        process_logits(np.zeros((2, 3)), SamplingParams())


def reference_top_p(x: np.ndarray, top_p: float) -> np.ndarray:
    """The top-p cut as docs/design.md §2 states it, by a full stable sort (process_logits' old body)."""
    x = x.copy()
    order = np.argsort(-x, kind="stable")
    n_keep = int(np.searchsorted(np.cumsum(softmax(x)[order]), top_p, side="left")) + 1
    x[order[n_keep:]] = -np.inf
    return x


@pytest.mark.parametrize("vocab", [TOP_P_CANDIDATES // 2, 3 * TOP_P_CANDIDATES, 151_936])
def test_top_p_is_the_full_sort_bit_for_bit(vocab):
    """The candidates' short cut gives the full sort's cut exactly: peaked and flat rows (where the
    candidates hold less than top_p and the full sort runs), ties at every value (small integers, with
    ties across the TOP_P_CANDIDATES-th value), top-k's -inf entries; 160 rows, seeded."""
    rng = np.random.default_rng(vocab)
    shortcuts = 0
    for row in range(40):
        shape = row % 4
        if shape == 0:  # peaked: the prefix is a handful of tokens
            z = rng.normal(0.0, 4.0, vocab)
        elif shape == 1:  # flat: the candidates never reach top_p
            z = rng.normal(0.0, 0.05, vocab)
        else:  # ties everywhere, a few high tokens
            z = rng.integers(-8, 3, vocab).astype(np.float64)
            z[rng.integers(0, vocab, 5)] = 9.0
        top_k = 0 if row % 3 else int(rng.integers(1, 2 * TOP_P_CANDIDATES))
        for top_p in (0.05, 0.5, 0.9, 0.99):
            params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
            want = reference_top_p(process_logits(z, SamplingParams(temperature=0.7, top_k=top_k)), top_p)
            got = process_logits(z, params)
            assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), (vocab, row, top_p)
            shortcuts += np.isfinite(got).sum() < TOP_P_CANDIDATES
    assert shortcuts > 0
