"""Exactness and draft invariance on the real target, SmolLM2-135M-Instruct, with its shipped draft.

- Draft invariance: 20 chat and code requests (through the model's chat template) x T in {0, 0.8}
  x every built-in drafter; GUMBEL speculative output must equal plain decoding token for token.
  A flip is tolerated only at a near-tie of plain decoding's top-two noisy scores (margin below
  TOLERANCE_DELTA); each is reported with its margin. The logit drift between pass shapes
  (verification-width passes vs the passes plain decoding sampled from) is measured on every
  request: inside the tolerance band, and zero on the served (skinny) kernel.
- Exactness: the first emitted token of a one-draft round under each proposer, for as many seeds
  as catch a deviation of Cohen's w = 0.1 with power 0.99 (tests/stats.py: 6,500), against the
  target's next-token distribution at T = 1 (chi-square, p > 1e-3).

Few and short on purpose: a real target pass costs ~50 ms here, and the suite must stay fast.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.invariance import check_first_token_fit, check_invariance
from verifier.model import score
from verifier.tolerance import TOLERANCE_DELTA

pytestmark = pytest.mark.slow(seconds=170)  # scheduled first (tests/conftest.py)

CHAT = [
    "Why is the sky blue?",
    "Give me three tips for better sleep.",
    "What is photosynthesis?",
    "Write a haiku about autumn.",
    "How do vaccines work?",
    "Explain compound interest in simple terms.",
    "What causes earthquakes?",
    "Summarize the history of the printing press.",
    "What is a black hole?",
    "How should I prepare for a job interview?",
]
CODE = [
    "Write a Python function `is_prime(n)` that returns True if n is prime.",
    "Write a Python function `reverse_words(s)` that reverses the order of words in a string.",
    "Write a Python function `fib(n)` that returns the n-th Fibonacci number.",
    "Write a Python function `read_json(path)` that loads a JSON file.",
    "Write a Python function `flatten(xs)` that flattens a nested list.",
    "Write a Python function `count_vowels(s)` that counts the vowels in s.",
    "Write a Python function `merge_dicts(a, b)` that merges two dictionaries.",
    "Write a Python function `chunks(xs, n)` that splits a list into pieces of size n.",
    "Write a Python function `is_palindrome(s)` that ignores case and spaces.",
    "Write a Python function `median(xs)` that returns the median of a list.",
]
DRAFTERS = ["honest", "random", "adversarial", "lying", "garbage"]
TEMPERATURES = [0.0, 0.8]
MAX_NEW = 8
GAMMA = 4
MAX_NEAR_TIE_FRACTION = 0.02


def chat_ids(tokenizer, text: str) -> list[int]:
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    return list(encoded["input_ids"])


def _drift(target, ids: list[int], tokens: list[int], plain_rows: np.ndarray) -> float:
    """Largest |logit| difference between verification passes (GAMMA + 1 positions each) and plain
    decoding's one-position passes (``plain_rows``, [len(tokens), V]; row i after ``ids +
    tokens[:i]``), after the same one-pass prefill: what separates speculative from plain decoding."""
    wide = target.fork()
    wide.extend(ids)  # the prefill, as plain decoding's (its row 0 is that pass's in both)
    scored = tokens[:-1]  # rows 1.. of plain decoding: after ids + tokens[:i], i >= 1
    verified = np.concatenate([wide.extend(scored[i : i + GAMMA + 1]) for i in range(0, len(scored), GAMMA + 1)])
    return float(np.max(np.abs(verified - plain_rows[1:])))


def test_speculative_equals_plain_on_the_real_target(real_pair):
    drifts: list[float] = []
    prompts = [chat_ids(real_pair.tokenizer, text) for text in CHAT + CODE]
    report = check_invariance(
        real_pair,
        prompts,
        DRAFTERS,
        TEMPERATURES,
        max_new=MAX_NEW,
        gamma=GAMMA,
        on_plain=lambda ids, tokens, rows: drifts.append(_drift(real_pair.target, ids, tokens, rows)),
    )
    print(f"logit drift between pass shapes on the real target: max {max(drifts):.2e}, mean {np.mean(drifts):.2e}")
    report.check(MAX_NEAR_TIE_FRACTION, "real-target invariance")
    assert max(drifts) < TOLERANCE_DELTA, f"pass-shape drift {max(drifts):.2e} leaves the tolerance band"
    if real_pair.target.kernel == "skinny":  # the served kernel works row by row: no drift at all
        assert max(drifts) == 0.0


@pytest.fixture(scope="module")
def real_next_token(real_pair):
    ids = chat_ids(real_pair.tokenizer, CHAT[0])
    target_logits = score(real_pair.target.fork(), ids)[0][-1].astype(np.float64)  # [V]
    draft_logits = score(real_pair.draft.fork(), ids)[0][-1].astype(np.float64)  # [V]
    return target_logits, draft_logits


@pytest.mark.parametrize("name", ["honest", "random", "adversarial", "lying"])
def test_first_token_matches_the_real_target_distribution(name, real_next_token):
    check_first_token_fit(name, *real_next_token)


def test_a_chat_answer_ends_at_the_end_of_the_turn(real_pair):
    """Requests stop at <|im_end|> (finish_reason "stop") and its text leaves the special token
    out; with ignore_eos the same templated prompt runs past it, and its tokens up to that point
    are the same (same seed). The receipt-ready request names the stop tokens."""
    import trio

    from node.target.chat import chat_prompt
    from node.target.engine import CompletionRequest, Engine

    engine = Engine(real_pair, model_name="smollm2", gamma=4)
    messages = [{"role": "user", "content": "Answer with one word, yes or no: is water wet?"}]
    prompt = tuple(chat_prompt(real_pair.tokenizer, messages))
    eos = real_pair.tokenizer.eos_token_id
    chat = trio.run(engine.complete, CompletionRequest(prompt, 24, 0.0))
    assert chat.finish_reason == "stop" and chat.tokens[-1] == eos and len(chat.tokens) < 24, chat.text
    assert "<|" not in chat.text and chat.text.strip(), chat.text
    longer = trio.run(engine.complete, CompletionRequest(prompt, len(chat.tokens) + 3, 0.0, ignore_eos=True))
    assert longer.finish_reason == "length" and longer.tokens[: len(chat.tokens)] == chat.tokens


@pytest.mark.parametrize("role", ["target", "draft"])
def test_the_lean_forward_computes_the_hf_forward_on_the_real_pair(real_pair, role):
    """The served kernel (the lean forward on the skinny kernel; the draft's sub-vocabulary head too)
    against HF's own forward on torch's kernel: prefill, one-position and verification-width passes,
    a rollback, far inside the band."""
    from node.model.loading import load_model_dir
    from node.model.pairs import get_pair

    named = get_pair("smollm2")
    lean = getattr(real_pair, role).fork()
    assert lean.kernel == "skinny"
    hf, _ = load_model_dir(named.target_dir() if role == "target" else named.draft_dir(), role, "plain")
    ids = chat_ids(real_pair.tokenizer, CODE[0])
    worst = 0.0
    for step in (ids, [1, 2, 3, 4, 5], [6], ("rollback", 3), [7, 8]):
        if step[0] == "rollback":
            hf.rollback(step[1]), lean.rollback(step[1])
            continue
        want, got = hf.extend(step), lean.extend(step)  # [len(step), V]
        assert (want.argmax(axis=1) == got.argmax(axis=1)).all()
        worst = max(worst, float(np.abs(want - got).max()))
    print(f"lean vs HF forward on the real {role}: max |logit difference| {worst:.2e}")
    assert worst < TOLERANCE_DELTA / 4


def test_the_shipped_draft_matches_its_manifest_and_size_cap():
    """models/smollm2-draft: every file as trained (sha256), at most 40 MB, made for the prepared
    target, measured on held-out chat and code prompts."""
    import hashlib
    import json

    from node.model.pairs import check_prepared, get_pair
    from node.model.subvocab import DRAFT_RECORD

    named = get_pair("smollm2")
    manifest = json.loads((named.draft / "MANIFEST.json").read_text())
    total = 0
    for name, digest in manifest["files"].items():
        data = (named.draft / name).read_bytes()
        total += len(data)
        assert hashlib.sha256(data).hexdigest() == digest, f"{name} changed since training"
    assert total <= 40 * 1024 * 1024
    record = json.loads((named.draft / DRAFT_RECORD).read_text())
    assert record["target_model_hash"] == check_prepared(named.target)["model_hash"]
    assert set(manifest["heldout"]) == {"chat", "code"}
    assert all(kind["positions"] >= 100 for kind in manifest["heldout"].values())
