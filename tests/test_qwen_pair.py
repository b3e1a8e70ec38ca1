"""Exactness and draft invariance on the default pair: Qwen2.5-Coder-1.5B-Instruct verified, its
0.5B sibling drafting (both prepared by `make setup` into packed float16 files).

- Draft invariance: 10 code and chat requests through the chat template × T ∈ {0, 0.8}: GUMBEL
  speculative output with the honest 0.5B draft equals plain decoding token for token; a flip is
  tolerated only at a near-tie (margin below TOLERANCE_DELTA), and each is reported.
- The trust band: every computation a party runs on this target gives the same bits. Plain
  decoding's rows (a one-pass prefill, then one-position steps), verification-width passes, a
  challenger's teacher-forced re-execution of the whole answer, and a referee's one-step replay of
  a disputed position: all run the packed model's one kernel, row by row, so the drift between any
  two is exactly 0 (the band, TOLERANCE_DELTA, is never even approached). Measured on the ten
  T = 0 requests (logits do not depend on T).
- Exactness: the first emitted token of a one-draft round under the honest, lying and random
  proposers, for as many seeds as catch a deviation of Cohen's w = 0.1 with power 0.99, against
  the target's real next-token distribution at T = 1 (chi-square, p > 1e-3).

Short on purpose: a target pass costs ~0.25 s here, and these tests must stay within ~3 minutes.
"""

from __future__ import annotations

import numpy as np
import pytest

from node.lab.workload import prompt_ids
from tests.invariance import check_first_token_fit, check_invariance
from verifier.model import score

pytestmark = pytest.mark.slow(seconds=180)  # scheduled first (tests/conftest.py)

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Write a JavaScript function that debounces another function.",
    "Write a SQL query that counts orders per customer.",
    "Write a Rust function that reverses a string.",
    "Write a bash command that finds the largest file in a directory.",
    "What is a closure in programming?",
    "Why is the sky blue?",
    "Explain recursion to a beginner in one paragraph.",
    "What is the difference between TCP and UDP?",
    "Give me two tips for naming variables.",
]
TEMPERATURES = [0.0, 0.8]
MAX_NEW = 8
GAMMA = 4
MAX_NEAR_TIE_FRACTION = 0.05  # at most one of the 20 runs


@pytest.fixture(scope="module")
def qwen_pair():
    from node.lab.bench_local import load_lab_pair

    return load_lab_pair("qwen2.5-coder")


def _replays(target, ids: list[int], tokens: list[int]) -> dict[str, np.ndarray]:
    """The rows other parties compute for ``ids + tokens`` (row i: the logits after ``ids +
    tokens[:i]``, as plain decoding's ``rows``)."""
    n = len(tokens)
    verifier = target.fork()
    first = verifier.extend(ids)[-1:]
    passes = [verifier.extend(tokens[i : i + GAMMA + 1]) for i in range(0, n - 1, GAMMA + 1)]
    verified = np.concatenate([first, *passes])[:n]
    challenger = score(target.fork(), ids, tokens[:-1])[0]  # one teacher-forced pass over the answer
    k = n // 2  # a referee replays one disputed step: the prompt and the output before it, one pass
    referee = score(target.fork(), [*ids, *tokens[:k]])[0][-1:]
    return {"verification passes": verified, "challenger": challenger, "referee": referee}


def test_speculative_equals_plain_and_every_party_computes_the_same_bits(qwen_pair):
    drifts: dict[str, float] = {}

    seen: list[int] = []

    def on_plain(ids: list[int], tokens: list[int], rows: np.ndarray) -> None:
        seen.append(len(seen))
        if len(seen) > len(PROMPTS):  # logits do not depend on T: the replays run on the T = 0 requests
            return
        for party, got in _replays(qwen_pair.target, ids, tokens).items():
            want = rows[len(tokens) // 2 : len(tokens) // 2 + 1] if party == "referee" else rows
            drifts[party] = max(drifts.get(party, 0.0), float(np.max(np.abs(got - want))))

    prompts = [prompt_ids(qwen_pair.tokenizer, text, chat=True) for text in PROMPTS]
    report = check_invariance(
        qwen_pair, prompts, ["honest"], TEMPERATURES, max_new=MAX_NEW, gamma=GAMMA, on_plain=on_plain
    )
    print(f"logit drift against plain decoding's rows on {qwen_pair.target.name}: {drifts}")
    report.check(MAX_NEAR_TIE_FRACTION, "qwen2.5-coder invariance")
    assert set(drifts) == {"verification passes", "challenger", "referee"}
    assert all(drift == 0.0 for drift in drifts.values()), drifts  # one kernel, row by row: bit-exact


@pytest.fixture(scope="module")
def next_token(qwen_pair):
    ids = prompt_ids(qwen_pair.tokenizer, PROMPTS[0], chat=True)
    target_logits = score(qwen_pair.target.fork(), ids)[0][-1].astype(np.float64)  # [V]
    draft_logits = score(qwen_pair.draft.fork(), ids)[0][-1].astype(np.float64)  # [V]
    return target_logits, draft_logits


@pytest.mark.parametrize("name", ["honest", "lying", "random"])
def test_first_token_matches_the_real_target_distribution(name, next_token):
    check_first_token_fit(name, *next_token)


def test_the_pair_is_the_pinned_models(qwen_pair):
    """The served pair is the two pinned models: Qwen2's shapes, one tokenizer, the recorded hashes."""
    from node.model.loading import model_hash
    from node.model.pairs import check_prepared, get_pair

    named = get_pair("qwen2.5-coder")
    for directory in (named.target_dir(), named.draft_dir()):
        assert model_hash(directory).hex() == check_prepared(directory)["model_hash"]
    target, draft = qwen_pair.target.weights, qwen_pair.draft.weights
    assert (len(target.layers), target.heads, target.kv_heads, target.head_dim) == (28, 12, 2, 128)
    assert (len(draft.layers), draft.heads, draft.kv_heads, draft.head_dim) == (24, 14, 2, 64)
    assert qwen_pair.target.vocab_size == qwen_pair.draft.vocab_size == 151_936
    assert qwen_pair.tokenizer.eos_token_id == 151_645
