"""No band between exact parties (node/chain/audit.py): for an exact model the challenger and the
referee compare tokens exactly. At a near-tie inside the old band (the top two logits closer than
TOLERANCE_DELTA), the honest token is judged right and the runner-up wrong, where the float rule
would have let the runner-up pass."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from exact_models import TOKENIZER_DIR, write_seeded_gguf

from node.chain.audit import audit_answer, judge_step, judged_exactly
from node.chain.receipts import Domain, Receipt, RequestSpec, SignedReceipt, hash_tokens, sign_receipt
from node.model.exact.convert import write_exact
from node.model.loading import load_model_dir, model_hash
from verifier.params import SamplingParams
from verifier.tolerance import TOLERANCE_DELTA, within_tolerance

ANVIL_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"  # anvil's dev account 0
ANVIL_ADDRESS = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"
GREEDY = SamplingParams(temperature=0.0)
HEAD_SCALE = 1e-3  # logits spread ~0.25: top-two gaps below δ on about 1 row in 100 (seeded, so fixed)
CONTEXT_SEED, CONTEXT_TOKENS = 3, 500


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    root = tmp_path_factory.mktemp("exact-tie")
    gguf = write_seeded_gguf(root / "seeded.gguf", head_scale=HEAD_SCALE)
    directory = write_exact(gguf, hashlib.sha256(gguf.read_bytes()).hexdigest(), root / "model", TOKENIZER_DIR)
    model, _ = load_model_dir(directory, "target")
    return model, directory


@pytest.fixture(scope="module")
def near_tie(exact) -> tuple[list[int], int, int, float]:
    """(context, honest token, runner-up, gap): the first row of a seeded sequence whose top two
    logits differ, by less than δ / 2."""
    model, _ = exact
    tokens = np.random.default_rng(CONTEXT_SEED).integers(0, model.vocab_size, CONTEXT_TOKENS).tolist()
    model.reset()
    logits = model.extend(tokens)  # row r: the logits after tokens[: r + 1]
    for row, scores in enumerate(logits):
        second, first = np.argsort(scores, kind="stable")[-2:]
        gap = float(scores[first] - scores[second])
        if 0 < gap < TOLERANCE_DELTA / 2:
            return tokens[: row + 1], int(first), int(second), gap
    pytest.fail(f"no near-tie in {CONTEXT_TOKENS} seeded rows: the seeded model changed")


def signed_answer(directory, prompt: list[int], output: list[int]) -> SignedReceipt:
    request = RequestSpec.build(prompt, GREEDY, seed=5, max_tokens=len(output))
    receipt = Receipt(ANVIL_ADDRESS, model_hash(directory), request.hash(), hash_tokens(output), len(output), 0, 1)
    domain = Domain(31337, "0x" + "11" * 20)
    return SignedReceipt(domain, receipt, sign_receipt(ANVIL_KEY, domain, receipt), request, tuple(output))


def test_the_float_band_would_let_the_runner_up_pass_succeeds(exact, near_tie):
    model, _ = exact
    context, _, runner_up, gap = near_tie
    model.reset()
    row = model.extend(context)[-1]
    assert judged_exactly(model) and 0 < gap < TOLERANCE_DELTA / 2
    assert within_tolerance(row, GREEDY, 5, 0, runner_up)  # what the old rule said: inside the band


def test_the_referee_judges_the_honest_token_right_and_the_runner_up_wrong_succeeds(exact, near_tie):
    model, _ = exact
    context, honest, runner_up, _ = near_tie
    assert not judge_step(model, context, [honest], 0, GREEDY, 5).at_fault
    assert judge_step(model, context, [runner_up], 0, GREEDY, 5).at_fault


def test_the_challenger_finds_the_runner_up_and_passes_the_honest_answer_succeeds(exact, near_tie):
    model, directory = exact
    context, honest, runner_up, _ = near_tie
    assert audit_answer(model, signed_answer(directory, context, [honest])).first_wrong is None
    cheat = audit_answer(model, signed_answer(directory, context, [runner_up]))
    assert cheat.first_wrong == 0 and cheat.margin is not None and cheat.margin < TOLERANCE_DELTA
