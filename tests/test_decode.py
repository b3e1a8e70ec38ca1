"""Decode loops on the synthetic Markov LM: stats, boundaries, stop tokens, failing proposers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.synthetic import MarkovLM, random_table
from verifier.decode import decode_plain, decode_speculative
from verifier.errors import InvalidParams, InvalidProposal, SpecmarketError
from verifier.params import SamplingParams
from verifier.proposal import Proposal, validate_proposal
from verifier.proposers import AdversarialProposer, LocalDraftProposer

V = 7
TABLE = random_table(V, seed=3)
PARAMS = SamplingParams(temperature=1.0)


def _local_spec(seed: int, max_new_tokens: int, gamma: int, **kwargs):
    """Speculative decoding of TABLE with a perfect (identical) local draft."""
    return decode_speculative(
        MarkovLM(TABLE),
        LocalDraftProposer(MarkovLM(TABLE)),
        [0],
        params=PARAMS,
        seed=seed,
        max_new_tokens=max_new_tokens,
        gamma=gamma,
        **kwargs,
    )


def test_perfect_drafter_emits_gamma_plus_one_tokens_per_pass():
    result = _local_spec(1, 25, 4)
    plain = decode_plain(MarkovLM(TABLE), [0], params=PARAMS, seed=1, max_new_tokens=25)
    assert result.tokens == plain.tokens
    assert result.stats.target_passes == 5 and result.stats.accepted_per_round == [4] * 5
    assert result.stats.acceptance_rate == 1.0 and result.stats.mean_accepted_length == 5.0
    # one pass per round, scoring the pending token + 4 drafts; the 1-token prompt is the first
    assert result.stats.target_positions == 25


def test_worst_drafter_still_emits_one_token_per_pass():
    result = decode_speculative(
        MarkovLM(TABLE), AdversarialProposer(MarkovLM(TABLE)), [0], params=PARAMS, seed=1, max_new_tokens=10, gamma=3
    )
    assert result.stats.target_passes == 10 and result.stats.draft_tokens_accepted == 0
    assert result.stats.mean_accepted_length == 1.0


@pytest.mark.parametrize("max_new", [0, 1, 2, 5, 9])
def test_never_emits_more_than_max_new_tokens(max_new):
    result = _local_spec(0, max_new, 4)
    assert len(result.tokens) == max_new


@pytest.mark.parametrize("picks", [(5,), (9, 5), (3, 12)])
def test_stop_tokens_end_decoding_at_the_first_one_identically(picks):
    """Several end-of-sequence tokens (Qwen has two): the answer ends at whichever comes first,
    plain and speculative alike, and is plain decoding's prefix up to it."""
    plain = decode_plain(MarkovLM(TABLE), [0], params=PARAMS, seed=4, max_new_tokens=40)
    stops = {plain.tokens[i] for i in picks}
    cut = min(plain.tokens.index(s) for s in stops) + 1
    a = decode_plain(MarkovLM(TABLE), [0], params=PARAMS, seed=4, max_new_tokens=40, stop_tokens=stops)
    b = _local_spec(4, 40, 4, stop_tokens=stops)
    assert a.tokens == b.tokens == plain.tokens[:cut]
    assert a.tokens[-1] in stops and not stops & set(a.tokens[:-1])


def test_streaming_callback_sees_every_token_in_order():
    seen: list[int] = []
    result = _local_spec(2, 13, 3, on_token=seen.extend)
    assert tuple(seen) == result.tokens


class _FailingProposer:
    name = "failing"

    def propose(self, context, *, start, gamma, params, seed):
        raise SpecmarketError("peer vanished")


def test_failing_proposer_costs_speed_not_correctness():
    plain = decode_plain(MarkovLM(TABLE), [0], params=PARAMS, seed=8, max_new_tokens=12)
    spec = decode_speculative(
        MarkovLM(TABLE), _FailingProposer(), [0], params=PARAMS, seed=8, max_new_tokens=12, gamma=2
    )
    assert spec.tokens == plain.tokens and spec.stats.invalid_proposals == 11


@pytest.mark.parametrize("kwargs", [{"max_new_tokens": -1}, {"gamma": 17}, {"gamma": -1}])
def test_bad_decode_arguments(kwargs):
    args = {"params": PARAMS, "seed": 0, "max_new_tokens": 3, "gamma": 2, **kwargs}
    with pytest.raises(InvalidParams):
        decode_speculative(MarkovLM(TABLE), _FailingProposer(), [0], **args)
    with pytest.raises(InvalidParams, match="at least one token"):
        decode_plain(MarkovLM(TABLE), [], params=PARAMS, seed=0, max_new_tokens=3)


_anything = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=5) | st.tuples(children, children),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    tokens=_anything,
    probs=st.none() | st.just(np.ones((1, V)) / V) | st.just(np.full((2, 3), np.inf)),
    need_probs=st.booleans(),
)
def test_validation_only_ever_raises_invalid_proposal(tokens, probs, need_probs):
    try:
        clean = validate_proposal(Proposal(tokens, probs), gamma=3, vocab_size=V, need_probs=need_probs)
    except InvalidProposal:
        return
    assert all(isinstance(t, int) and 0 <= t < V for t in clean.tokens) and len(clean.tokens) <= 3


def test_merged_stats_pool_rounds_across_decodes():
    a, b = _local_spec(1, 25, 4).stats, _local_spec(2, 7, 3).stats
    merged = type(a).merged([a, b])
    assert merged.target_passes == a.target_passes + b.target_passes
    assert merged.accepted_per_round == a.accepted_per_round + b.accepted_per_round
    assert merged.mean_accepted_length == (25 + 7) / merged.target_passes
