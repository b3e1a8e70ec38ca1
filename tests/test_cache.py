"""KV-cache rollback of the transformers 5 adapter: rolled-back caches score exactly like fresh ones."""

from __future__ import annotations

import numpy as np
import pytest

from node.model.adapter import HFCausalLM
from verifier.errors import ContextTooLong
from verifier.model import common_prefix, score

ATOL = 1e-4  # float32 logits; different pass shapes differ in the low bits only


def test_rollback_then_extend_equals_fresh_scoring(pair):
    lm = pair.target.fork()
    tokens = list(range(10, 40))
    lm.extend(tokens)
    lm.rollback(7)
    assert list(lm.cached()) == tokens[:-7]
    after = lm.extend([5, 6, 7])
    fresh = pair.target.fork().extend([*tokens[:-7], 5, 6, 7])[-3:]
    np.testing.assert_allclose(after, fresh, atol=ATOL)


def test_score_rolls_back_rejected_drafts(pair):
    lm = pair.draft.fork()
    context = [0, 11, 12, 13]
    logits, positions = score(lm, context, [50, 51, 52])  # drafts 50..52 enter the cache
    assert positions == 7 and logits.shape == (4, lm.vocab_size)
    logits2, positions2 = score(lm, [*context, 50, 99], [])  # 51, 52 rejected; 99 recovered
    assert positions2 == 1  # only the recovered token is new
    assert list(lm.cached()) == [*context, 50, 99]
    fresh = pair.draft.fork().extend([*context, 50, 99])[-1]
    np.testing.assert_allclose(logits2[-1], fresh, atol=ATOL)


def test_score_after_full_acceptance_rescoring_last_token(pair):
    lm = pair.draft.fork()
    score(lm, [0, 1, 2], [3])
    logits, positions = score(lm, [0, 1, 2, 3])  # everything cached: re-score only the last token
    assert positions == 1
    np.testing.assert_allclose(logits[-1], pair.draft.fork().extend([0, 1, 2, 3])[-1], atol=ATOL)


def test_rollback_bounds_and_context_window(pair):
    lm: HFCausalLM = pair.draft.fork()
    lm.extend([1, 2])
    with pytest.raises(ValueError):
        lm.rollback(3)
    with pytest.raises(ContextTooLong, match="context window"):
        lm.extend([1] * lm.max_positions)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2
