"""Unit tests of verify(): terms, shapes, and the GUMBEL/LEVIATHAN mechanics."""

import numpy as np
import pytest

from verifier.errors import InvalidParams, InvalidProposal
from verifier.params import SamplingParams
from verifier.verify import Rule, Verdict, sample_token, score_margin, verify

V = 16
PARAMS = SamplingParams(temperature=1.0)


def _logits(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, V))


def _target_tokens(logits: np.ndarray, seed: int, start: int) -> list[int]:
    return [sample_token(row, PARAMS, seed, start + i) for i, row in enumerate(logits)]


def test_all_drafts_matching_are_accepted_plus_bonus():
    logits = _logits(4)
    ys = _target_tokens(logits, seed=3, start=10)
    verdict = verify(logits, ys[:3], params=PARAMS, seed=3, start=10)
    assert verdict == Verdict(tuple(ys), 3)


def test_first_mismatch_emits_recovered_target_token_and_stops():
    logits = _logits(4)
    ys = _target_tokens(logits, seed=3, start=0)
    wrong = (ys[1] + 1) % V
    verdict = verify(logits, [ys[0], wrong, ys[2]], params=PARAMS, seed=3, start=0)
    assert verdict == Verdict((ys[0], ys[1]), 1)


def test_gamma_zero_is_one_plain_sample():
    logits = _logits(1)
    assert verify(logits, [], params=PARAMS, seed=9, start=4) == Verdict((sample_token(logits[0], PARAMS, 9, 4),), 0)
    lev = verify(logits, [], params=PARAMS, seed=9, start=4, rule=Rule.LEVIATHAN)
    assert lev.tokens == (sample_token(logits[0], PARAMS, 9, 4),)


def test_greedy_is_argmax():
    logits = _logits(3)
    greedy = SamplingParams(temperature=0.0)
    argmaxes = [int(np.argmax(r)) for r in logits]
    assert verify(logits, argmaxes[:2], params=greedy, seed=0, start=0).tokens == tuple(argmaxes)


def test_draft_token_with_zero_target_probability_is_never_accepted():
    logits = _logits(2)
    top1 = SamplingParams(temperature=1.0, top_k=1)
    worst = int(np.argmin(logits[0]))
    for seed in range(50):
        verdict = verify(
            logits, [worst], params=top1, seed=seed, start=0, rule=Rule.LEVIATHAN, draft_probs=np.full((1, V), 1.0 / V)
        )
        assert verdict.n_accepted == 0 and verdict.tokens[0] == int(np.argmax(logits[0]))


def test_shape_errors_are_clear():
    with pytest.raises(InvalidParams, match=r"\[γ\+1, V\]"):
        verify(_logits(2), [1, 2], params=PARAMS, seed=0, start=0)
    with pytest.raises(InvalidProposal, match="draft_probs"):
        verify(_logits(2), [1], params=PARAMS, seed=0, start=0, rule=Rule.LEVIATHAN)
    with pytest.raises(InvalidProposal, match="draft_probs must be"):
        verify(_logits(2), [1], params=PARAMS, seed=0, start=0, rule=Rule.LEVIATHAN, draft_probs=np.ones((2, V)))


def test_score_margin_is_gap_between_top_two():
    row = np.array([0.0, 5.0, 4.5, -1.0])
    assert score_margin(row, SamplingParams(temperature=0.0), 0, 0) == pytest.approx(0.5)


def test_within_tolerance_band():
    from verifier.tolerance import TOLERANCE_DELTA, within_tolerance

    greedy = SamplingParams(temperature=0.0)
    row = np.array([1.0, 1.0 - TOLERANCE_DELTA / 2, 1.0 - 2 * TOLERANCE_DELTA, -3.0])
    assert within_tolerance(row, greedy, 0, 0, 0) and within_tolerance(row, greedy, 0, 0, 1)
    assert not within_tolerance(row, greedy, 0, 0, 2) and not within_tolerance(row, greedy, 0, 0, 3)
    logits = _logits(1)[0]
    y = sample_token(logits, PARAMS, 5, 2)
    assert within_tolerance(logits, PARAMS, 5, 2, y)
