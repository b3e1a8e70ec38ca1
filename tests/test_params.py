import numpy as np
import pytest

from verifier.errors import InvalidParams, SpecmarketError
from verifier.params import SamplingParams, process_logits, token_probs


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
