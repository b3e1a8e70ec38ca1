"""Validation of untrusted proposals; garbage never crashes decoding."""

import numpy as np
import pytest

from tests.synthetic import MarkovLM, random_table
from verifier.decode import decode_plain, decode_speculative
from verifier.errors import InvalidProposal
from verifier.params import SamplingParams
from verifier.proposal import Proposal, validate_proposal
from verifier.proposers import GarbageProposer
from verifier.verify import Rule

V = 8


@pytest.mark.parametrize("need_probs", [False, True])
def test_every_garbage_proposal_is_rejected_under_leviathan_and_most_under_gumbel(need_probs):
    garbage = GarbageProposer(V)
    rejected = 0
    for _ in range(12):
        raw = garbage.propose([0], start=0, gamma=3, params=SamplingParams(), seed=0)
        try:
            validate_proposal(raw, gamma=3, vocab_size=V, need_probs=need_probs)
        except InvalidProposal:
            rejected += 1
    # under GUMBEL claimed probabilities are ignored, so the 3 bad-probability cases are valid tokens
    assert rejected == (12 if need_probs else 9)


def test_valid_proposal_is_normalised():
    probs = np.full((2, V), 1.0 / V, dtype=np.float32)
    clean = validate_proposal(Proposal([np.int64(1), 2], probs), gamma=2, vocab_size=V, need_probs=True)
    assert clean.tokens == (1, 2) and clean.probs.dtype == np.float64
    assert validate_proposal(Proposal((3,), None), gamma=2, vocab_size=V, need_probs=False).probs is None


@pytest.mark.parametrize(
    "raw,message",
    [
        (Proposal((1, 2, 3)), "exceed"),
        (Proposal((V,)), "outside the vocabulary"),
        (Proposal(("a",)), "not an integer"),
        (Proposal(5), "list of ints"),
        ({"tokens": [1]}, "expected a Proposal"),
    ],
)
def test_validation_messages(raw, message):
    with pytest.raises(InvalidProposal, match=message):
        validate_proposal(raw, gamma=2, vocab_size=V, need_probs=False)


@pytest.mark.parametrize("rule", [Rule.GUMBEL, Rule.LEVIATHAN])
def test_garbage_proposer_does_not_change_output_or_crash(rule):
    table = random_table(V, seed=2)
    params = SamplingParams(temperature=1.0)
    plain = decode_plain(MarkovLM(table), [0], params=params, seed=7, max_new_tokens=30)
    spec = decode_speculative(
        MarkovLM(table), GarbageProposer(V), [0], params=params, seed=7, max_new_tokens=30, gamma=3, rule=rule
    )
    assert spec.tokens == plain.tokens
    assert spec.stats.invalid_proposals > 0
    if rule is Rule.LEVIATHAN:  # every garbage proposal is invalid there: decoding falls back to plain
        assert spec.stats.draft_tokens_proposed == 0
