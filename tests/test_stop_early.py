"""Receipts cover where an answer ends (issue 40 §5): an operator that stops an answer early, before
``max_tokens`` and not at a stop token or stop sequence, and charges for it, is challenged at the
answer's end (``SpecmarketBond.challengeEnd``), judged by a referee quorum by the stop rule its
receipt commits to, and slashed like a wrong token. Before, every token being the target's, the
challenger found the receipt correct and nothing was submitted. Real anvil, the shipped tiny pair.
"""

from __future__ import annotations

from functools import partial

import pytest
from chainutil import new_operator

from node.chain.challenger import challenge_receipt
from node.chain.deployment import DEV_CHALLENGER, DEV_REFEREES, dev_address, dev_key
from node.chain.receipts import RequestSpec, SignedReceipt
from node.chain.referee import Referee
from node.model.decoding import text_of
from node.model.loading import TINY_TARGET, model_hash
from verifier.decode import decode_plain
from verifier.params import SamplingParams

pytestmark = pytest.mark.slow(seconds=20)  # scheduled early (tests/conftest.py)

PROMPT = "def parse_args(argv):"
MAX_TOKENS = 12
AT_FAULT, CLEARED = 2, 3  # SpecmarketBond.ChallengeStatus
WRONG_TOKEN = 1  # SpecmarketBond.SlashReason: an early end is slashed like a wrong token


@pytest.fixture(scope="module")
def committed_hash() -> bytes:
    return model_hash(TINY_TARGET)


def honest(pair, spec: RequestSpec) -> tuple[int, ...]:
    """What an honest operator answers: plain decoding by the request's rule."""
    pair.target.reset()
    return decode_plain(
        pair.target,
        spec.prompt,
        params=spec.params,
        seed=spec.seed,
        max_new_tokens=spec.max_tokens,
        stop_tokens=spec.stop_tokens,
    ).tokens


def referees(chain, pair, committed_hash, pool) -> list[Referee]:
    text = partial(text_of, pair.tokenizer)
    return [Referee(chain.client, [dev_key(i)], pair.target, committed_hash, pool, text) for i in DEV_REFEREES[:2]]


def test_an_operator_that_stops_early_is_challenged_at_the_end_and_slashed(chain, pair, committed_hash, tmp_path):
    operator, _ = new_operator(chain, tmp_path, committed_hash)
    eos = pair.tokenizer.eos_token_id
    prompt = [eos, *pair.tokenizer.encode(PROMPT)]
    spec = RequestSpec.build(prompt, SamplingParams(temperature=1.0), 4, MAX_TOKENS, stop_tokens=[eos])
    full = honest(pair, spec)
    assert len(full) == MAX_TOKENS and eos not in full  # this seed runs to max_tokens
    cut = full[: MAX_TOKENS // 2]  # every token the target's own, then stopped and charged as if done
    signed = operator.sign(spec, cut)
    report = challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed)
    assert report.challenge_id is not None and report.position == len(cut)  # old: "correct", nothing submitted
    audit = report.audit
    assert audit.first_wrong is None and audit.early_end and audit.next_token == full[len(cut)]
    first, second = referees(chain, pair, committed_hash, tmp_path / "pool")
    (alone,) = [o for o in first.run_once() if o.challenge_id == report.challenge_id]  # other modules' too
    (quorum,) = [o for o in second.run_once() if o.challenge_id == report.challenge_id]
    assert alone.operator_at_fault and quorum.operator_at_fault and quorum.resolved
    assert quorum.target_positions == len(prompt) + len(cut)  # the step after the end, re-executed
    assert chain.client.challenge_record(report.challenge_id)["status"] == AT_FAULT
    (slash,) = chain.client.events("OperatorSlashed", operator=operator.address)
    assert slash["reason"] == WRONG_TOKEN and slash["reporter"] == dev_address(DEV_CHALLENGER)


def test_an_answer_ended_by_its_stop_sequence_is_not_challenged_and_a_forced_end_challenge_is_cleared(
    chain, pair, committed_hash, tmp_path
):
    """The honest side: an answer that ends with the token completing its stop sequence is correct
    (the challenger sends nothing); a referee asked anyway (a challenge sent by hand) clears it."""
    operator, _ = new_operator(chain, tmp_path, committed_hash)
    eos, text = pair.tokenizer.eos_token_id, partial(text_of, pair.tokenizer)
    prompt = [eos, *pair.tokenizer.encode(PROMPT)]
    plain = RequestSpec.build(prompt, SamplingParams(temperature=1.0), 4, MAX_TOKENS, stop_tokens=[eos])
    full = honest(pair, plain)
    stop = text(full[:4])[-2:]  # the last two characters of the answer's first four tokens
    spec = RequestSpec.build(prompt, SamplingParams(temperature=1.0), 4, MAX_TOKENS, [eos], [stop])
    end = spec.end_of(full, text)
    assert end is not None and end <= 4
    signed = operator.sign(spec, full[:end])
    report = challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed, text=text)
    assert report.challenge_id is None and not report.audit.early_end
    cid, _ = chain.client.challenge_end(dev_key(DEV_CHALLENGER), signed)  # a false end challenge, by hand
    first, second = referees(chain, pair, committed_hash, tmp_path / "pool")
    first.run_once()
    (outcome,) = [o for o in second.run_once() if o.challenge_id == cid]
    assert outcome.operator_at_fault is False and outcome.resolved
    assert chain.client.challenge_record(cid)["status"] == CLEARED
    assert not chain.client.events("OperatorSlashed", operator=operator.address)


def test_an_answer_that_reached_max_tokens_cannot_be_challenged_at_its_end(chain, pair, committed_hash, tmp_path):
    from node.chain.client import ChainRevert

    operator, _ = new_operator(chain, tmp_path, committed_hash)
    eos = pair.tokenizer.eos_token_id
    spec = RequestSpec.build([eos, 5, 6], SamplingParams(temperature=1.0), 4, 3, stop_tokens=[eos])
    signed = operator.sign(spec, honest(pair, spec))
    with pytest.raises(ChainRevert, match=r"AnswerReachedMaxTokens|EndedByStopToken"):
        chain.client.challenge_end(dev_key(DEV_CHALLENGER), signed)


def test_the_stop_early_cheat_answers_half_and_is_slashed(chain, pair, committed_hash, tmp_path):
    """`specmarket target --cheat stop-early`: an answer of half of max_tokens, receipted as done."""
    from netutil import complete, start_target

    target = start_target(
        tmp_path, "--chain", chain.rpc, "--deployments", str(chain.deployments), "--max-drafters", "0",
        "--cheat", "stop-early",
    )  # fmt: skip
    try:
        answer = complete(target.lines["http"][0], PROMPT, seed=4, max_tokens=MAX_TOKENS, temperature=1.0)
    finally:
        target.stop()
    signed = SignedReceipt.from_json(answer["specmarket"]["receipt"])
    assert len(signed.output) == MAX_TOKENS // 2 and signed.request.max_tokens == MAX_TOKENS
    report = challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed)
    assert report.audit.early_end and report.challenge_id is not None
    first, second = referees(chain, pair, committed_hash, tmp_path / "pool")
    first.run_once()
    (outcome,) = [o for o in second.run_once() if o.challenge_id == report.challenge_id]
    assert outcome.operator_at_fault and outcome.resolved
    assert chain.client.events("OperatorSlashed", operator=signed.receipt.operator)
