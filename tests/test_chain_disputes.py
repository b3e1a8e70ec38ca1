"""Disputes end to end on a real anvil chain, with bonded target processes and the shipped models.

- an honest bonded target (speculating with an honest drafter peer) signs receipts that the
  challenge script finds correct, spending nothing;
- `--cheat flip-token` and `--cheat draft-model` targets are challenged, a referee quorum resolves,
  the operator is slashed, the challenger is paid, and the events say so;
- a false challenge (a token inside the tolerance band) loses the challenger's bond and slashes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from chainutil import new_operator, sign_raw
from eth_account import Account
from netutil import SPECMARKET, complete, start_drafter, start_target, wait_for_drafters

from node.chain.challenger import challenge_receipt
from node.chain.deployment import DEV_CHALLENGER, DEV_REFEREES, dev_address, dev_key
from node.chain.receipts import CLOCK_SLACK_S, Domain, ReceiptError, RequestSpec, SignedReceipt
from node.chain.referee import Referee
from node.model.loading import TINY_TARGET, model_hash
from verifier.params import SamplingParams
from verifier.tolerance import TOLERANCE_DELTA, within_tolerance
from verifier.verify import noisy_scores

pytestmark = pytest.mark.slow(seconds=40)  # scheduled first (tests/conftest.py)

SCRIPTS_TIMEOUT_S = 180
PROMPT = "def parse_args(argv):"
MAX_TOKENS = 16
AT_FAULT, CLEARED = 2, 3  # SpecmarketBond.ChallengeStatus
WATCH_POLL_S = 0.1
NEAR_TIE_SEARCH = 20_000  # seeds tried to find a near-tie at position 0


def bonded_target(tmp, chain, *extra: str):
    return start_target(tmp, "--chain", chain.rpc, "--deployments", str(chain.deployments), *extra)


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, f"scripts/{name}.py", *args], capture_output=True, text=True, timeout=SCRIPTS_TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def receipt_of(answer: dict) -> SignedReceipt:
    signed = SignedReceipt.from_json(answer["specmarket"]["receipt"])
    signed.check()
    assert list(signed.output) == answer["specmarket"]["tokens"]
    return signed


@pytest.fixture(scope="module")
def committed_hash() -> bytes:
    return model_hash(TINY_TARGET)


def test_honest_speculating_operator_is_found_correct_and_nothing_is_spent(chain, pair, committed_hash, tmp_path):
    target = bonded_target(tmp_path, chain, "--max-drafters", "1")
    drafter = start_drafter(tmp_path, target.lines["multiaddr"][0], "honest", "d0")
    try:
        http = target.lines["http"][0]
        wait_for_drafters(http, 1)
        answers = [
            complete(http, PROMPT, seed=s, max_tokens=MAX_TOKENS, temperature=t, top_p=p)
            for s, t, p in ((1, 1.0, 1.0), (2, 0.0, 1.0), (3, 0.8, 0.9))
        ]
        again = complete(http, PROMPT, seed=1, max_tokens=MAX_TOKENS, temperature=1.0)
        over_p2p = tmp_path / "p2p-receipt.json"  # the same request over libp2p, saved by `specmarket ask`
        ask = [*SPECMARKET, "ask", PROMPT, "--target", target.lines["multiaddr"][0], "--seed", "1", "--pair", "tiny"]
        ask += chain.cli_args()  # the deployment the client checks the receipt's operator on
        ask += ["--max-new-tokens", str(MAX_TOKENS), "--receipt-out", str(over_p2p)]
        asked = subprocess.run(ask, capture_output=True, text=True, timeout=SCRIPTS_TIMEOUT_S)
        assert asked.returncode == 0, asked.stderr[-3000:]
    finally:
        drafter.stop()
        target.stop()
    restarted = bonded_target(tmp_path, chain, "--max-drafters", "0")  # same data dir, same operator key
    try:
        after_restart = complete(restarted.lines["http"][0], PROMPT, seed=1, max_tokens=MAX_TOKENS, temperature=1.0)
    finally:
        restarted.stop()
    assert after_restart["specmarket"]["receipt"] == answers[0]["specmarket"]["receipt"]  # kept in SQLite
    assert after_restart["specmarket"]["stats"]["replayed"] == 1
    receipts = [receipt_of(a) for a in answers]
    assert sum(a["specmarket"]["stats"]["draft_tokens_accepted"] for a in answers) > 0  # it did speculate
    assert receipts[0].receipt.model_hash == committed_hash
    assert again["specmarket"]["receipt"] == answers[0]["specmarket"]["receipt"]  # a repeat is not re-signed
    assert json.loads(over_p2p.read_text()) == answers[0]["specmarket"]["receipt"]
    assert "receipt signed by operator" in asked.stderr
    path = tmp_path / "receipt.json"
    path.write_text(receipts[0].dumps())
    challenger = dev_address(DEV_CHALLENGER)
    w3 = chain.client.w3
    before = (w3.eth.get_balance(challenger), w3.eth.get_transaction_count(challenger))
    out = json.loads(
        run_script("challenge", "--pair", "tiny", "--receipt", str(path), "--json", *chain.cli_args()).stdout
    )
    assert out["correct"] and out["challenge_id"] is None and out["tokens_checked"] == MAX_TOKENS
    for signed in receipts[1:]:  # the other two, in-process (same code path as the script)
        report = challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed)
        assert report.audit.first_wrong is None and report.challenge_id is None
    assert (w3.eth.get_balance(challenger), w3.eth.get_transaction_count(challenger)) == before


def cheating_answer(tmp_path, chain, cheat: str, seed: int) -> tuple[dict, SignedReceipt]:
    """One answer (and its receipt) from a bonded target process run with ``--cheat cheat``."""
    target = bonded_target(tmp_path, chain, "--max-drafters", "0", "--cheat", cheat)
    try:
        answer = complete(target.lines["http"][0], PROMPT, seed=seed, max_tokens=MAX_TOKENS, temperature=1.0)
    finally:
        target.stop()
    return answer, receipt_of(answer)


def test_flip_token_operator_is_challenged_resolved_and_slashed(chain, tmp_path):
    from node.target.engine import flip_position

    answer, signed = cheating_answer(tmp_path, chain, "flip-token", seed=5)
    operator = signed.receipt.operator
    path = tmp_path / "cheat.json"
    path.write_text(json.dumps(answer))  # a whole API answer is accepted as a receipt file too
    out = json.loads(
        run_script("challenge", "--pair", "tiny", "--receipt", str(path), "--json", *chain.cli_args()).stdout
    )
    assert out["first_wrong"] == flip_position(signed.request) and out["margin"] > TOLERANCE_DELTA
    cid = out["challenge_id"]
    challenger = dev_address(DEV_CHALLENGER)
    credits_before = chain.client.credits(challenger)
    printed = run_script(
        "referee", "--pair", "tiny", "--once", "--pool", str(tmp_path / "pool"), *chain.cli_args()
    ).stdout
    step = len(signed.request.prompt) + out["first_wrong"]  # the referee re-executes only the disputed step
    assert f"challenge {cid}: operator at fault; resolved on chain (re-executed {step} target positions in" in printed
    assert_slashed(chain, cid, operator, challenger, credits_before)


def assert_slashed(chain, cid: int, operator: str, challenger: str, credits_before: int) -> None:
    cfg = chain.client.config()
    assert chain.client.challenge_record(cid)["status"] == AT_FAULT
    (resolved,) = [e for e in chain.client.events("ChallengeResolved") if e["id"] == cid]
    assert resolved["operatorAtFault"] and resolved["slashed"] == cfg.slash_amount
    slashes = chain.client.events("OperatorSlashed", operator=operator)
    assert len(slashes) == 1 and slashes[0]["reporter"] == challenger and slashes[0]["reason"] == 1  # WrongToken
    reward = cfg.slash_amount * cfg.challenger_reward_bps // 10_000
    assert chain.client.credits(challenger) - credits_before == reward + cfg.challenger_bond
    assert chain.client.operator_info(operator).bond == cfg.min_bond - cfg.slash_amount
    balance = chain.client.w3.eth.get_balance(challenger)
    tx = chain.client.withdraw(dev_key(DEV_CHALLENGER))  # the challenger is paid by pull
    (withdrawn,) = chain.client.decode_events(tx, "Withdrawn")
    assert withdrawn["amount"] >= reward + cfg.challenger_bond and chain.client.credits(challenger) == 0
    assert chain.client.w3.eth.get_balance(challenger) > balance


def test_draft_model_operator_is_slashed_by_a_quorum_of_separate_referees(chain, pair, committed_hash, tmp_path):
    _, signed = cheating_answer(tmp_path, chain, "draft-model", seed=9)
    assert signed.receipt.model_hash == committed_hash  # it claims the target model
    challenger = dev_address(DEV_CHALLENGER)
    credits_before = chain.client.credits(challenger)
    report = challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed)
    assert report.challenge_id is not None and report.audit.margin > TOLERANCE_DELTA
    pool = tmp_path / "pool"  # two referee processes (here: objects) with one key each, one shared pool
    first, second = (Referee(chain.client, [dev_key(i)], pair.target, committed_hash, pool) for i in DEV_REFEREES[:2])
    (alone,) = first.run_once()
    assert alone.operator_at_fault and alone.signatures == 1 and not alone.resolved  # 1 of 2: no quorum
    (quorum,) = second.run_once()
    assert quorum.operator_at_fault and quorum.signatures == 2 and quorum.resolved
    step = len(signed.request.prompt) + report.audit.first_wrong  # prompt + the output before the disputed token
    assert alone.target_positions == quorum.target_positions == step and alone.seconds > 0 and quorum.seconds > 0
    assert_slashed(chain, report.challenge_id, signed.receipt.operator, challenger, credits_before)


def near_tie(pair, prompt: list[int], params: SamplingParams) -> tuple[int, int, int]:
    """(seed, sampled token, runner-up) where the runner-up's noisy score is inside the band at k = 0
    (the band is in logit units: a gap in noisy score times T)."""
    pair.target.reset()
    logits = pair.target.extend(prompt)[-1]
    for seed in range(NEAR_TIE_SEARCH):
        scores = noisy_scores(logits, params, seed, 0)
        second, best = np.argsort(scores)[-2:]
        if 1e-5 < params.temperature * (scores[best] - scores[second]) < TOLERANCE_DELTA / 2:  # well inside
            return seed, int(best), int(second)
    raise AssertionError(f"no near-tie in {NEAR_TIE_SEARCH} seeds")


def test_token_inside_the_band_is_not_slashed_and_a_false_challenge_loses_its_bond(
    chain, pair, committed_hash, tmp_path
):
    operator, _ = new_operator(chain, tmp_path, committed_hash)
    prompt = [pair.tokenizer.eos_token_id, *pair.tokenizer.encode(PROMPT)]
    params = SamplingParams(temperature=1.0)
    seed, sampled, runner_up = near_tie(pair, prompt, params)
    spec = RequestSpec.build(prompt, params, seed, 1)
    signed = operator.sign(spec, (runner_up,))  # not what plain decoding samples, but inside the band
    pair.target.reset()
    assert within_tolerance(pair.target.extend(prompt)[-1], spec.params, seed, 0, runner_up) and runner_up != sampled
    challenger = dev_address(DEV_CHALLENGER)
    nonce = chain.client.w3.eth.get_transaction_count(challenger)
    report = challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed)
    assert report.audit.first_wrong is None and report.challenge_id is None
    assert chain.client.w3.eth.get_transaction_count(challenger) == nonce  # nothing sent
    cfg = chain.client.config()
    operator_credits = chain.client.credits(operator.address)
    forced = challenge_receipt(
        chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed, force_position=0, force=True
    )
    referee = Referee(chain.client, [dev_key(i) for i in DEV_REFEREES], pair.target, committed_hash, tmp_path / "p")
    (outcome,) = referee.run_once()
    assert outcome.challenge_id == forced.challenge_id and outcome.operator_at_fault is False and outcome.resolved
    assert chain.client.challenge_record(forced.challenge_id)["status"] == CLEARED
    assert chain.client.operator_info(operator.address).bond == cfg.min_bond  # not slashed
    assert chain.client.credits(operator.address) - operator_credits == cfg.challenger_bond  # the bond goes to it
    assert not chain.client.events("OperatorSlashed", operator=operator.address)


@pytest.mark.parametrize("foreign", ["chain", "contract"])
def test_challenger_refuses_a_receipt_for_another_deployment(chain, pair, committed_hash, tmp_path, foreign):
    _, key = new_operator(chain, tmp_path, committed_hash)
    here = chain.client.domain
    other = Domain(1, here.contract) if foreign == "chain" else Domain(here.chain_id, Account.create().address)
    signed = sign_raw(key, chain, RequestSpec.build([1, 2], SamplingParams(), 1, 2), (3, 4), committed_hash, other)
    signed.check()  # a valid receipt, in its own domain
    with pytest.raises(ReceiptError, match="signed for contract"):
        challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed)


@pytest.mark.parametrize("lead_s", [2, CLOCK_SLACK_S + 120])
def test_challenger_waits_for_a_receipt_stamped_ahead_of_the_chain(chain, pair, committed_hash, tmp_path, lead_s):
    """An operator whose clock runs ahead of the chain's stamps receipts from the chain's future, which
    the contract refuses to judge (``ReceiptFromFuture``). Within the clients' slack the challenger
    waits for the chain to reach the stamp, then challenges (it used to revert); beyond it, it refuses
    and sends nothing."""
    _, key = new_operator(chain, tmp_path, committed_hash)
    issued_at = chain.client.chain_time() + lead_s
    spec = RequestSpec.build([1, 2], SamplingParams(), 1, 2)
    signed = sign_raw(key, chain, spec, (3, 4), committed_hash, issued_at=issued_at)
    challenger = dev_address(DEV_CHALLENGER)
    nonce = chain.client.w3.eth.get_transaction_count(challenger)
    forced = {"force_position": 0, "force": True}  # whatever the audit says: the clock is under test
    if lead_s > CLOCK_SLACK_S:
        with pytest.raises(ReceiptError, match="ahead of the chain's clock"):
            challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed, **forced)
        assert chain.client.w3.eth.get_transaction_count(challenger) == nonce  # nothing sent
        return
    report = challenge_receipt(chain.client, dev_key(DEV_CHALLENGER), pair.target, committed_hash, signed, **forced)
    assert report.challenge_id is not None
    assert chain.client.challenge_record(report.challenge_id)["created_at"] >= issued_at


def test_referee_watch_survives_its_chain_going_away(pair, committed_hash, tmp_path, caplog):
    """A referee whose RPC endpoint disappears (anvil stopped, node restarting) logs each failed
    round and keeps watching; it used to die with a requests ConnectionError traceback."""
    from chainutil import deployed_chain

    stop = threading.Event()
    with deployed_chain(tmp_path / "deployments") as chain:
        referee = Referee(chain.client, [dev_key(DEV_REFEREES[0])], pair.target, committed_hash, tmp_path / "pool")
        watcher = threading.Thread(target=referee.watch, args=(stop, WATCH_POLL_S), daemon=True)
        watcher.start()
        time.sleep(3 * WATCH_POLL_S)  # a few good rounds first
    time.sleep(5 * WATCH_POLL_S)  # anvil is gone now
    assert watcher.is_alive()
    stop.set()
    watcher.join(timeout=10)
    assert not watcher.is_alive()
    assert any("referee round failed" in r.getMessage() for r in caplog.records)
