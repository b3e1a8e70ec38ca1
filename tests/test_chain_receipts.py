"""Receipts, signatures, bonding and equivocation against SpecmarketBond on a real anvil chain.

Hashes and EIP-712 digests computed in Python must equal the contract's, signatures must verify
both ways (Python-signed checked on chain, chain-digest-signed checked in Python), and a receipt
signed for another chain or contract must not verify.
"""

from __future__ import annotations

import random
import threading
from dataclasses import replace

import pytest
from chainutil import new_operator, request, sign_raw
from eth_account import Account
from eth_keys.constants import SECPK1_N
from eth_utils import keccak

from node.chain.client import ChainRevert
from node.chain.deployment import dev_address, dev_key
from node.chain.receipts import (
    MICROS,
    Disputed,
    Domain,
    ReceiptError,
    RequestSpec,
    SignedReceipt,
    hash_tokens,
    quantize,
    receipt_signable,
    recover_receipt_signer,
    stop_hash,
    verdict_signable,
)
from node.chain.store import ReceiptStore
from verifier.params import SamplingParams

N_RANDOM_CASES = 12


def digest_of(signable) -> bytes:
    """EIP-191 version 0x01 (EIP-712) digest of an eth-account SignableMessage."""
    return keccak(b"\x19" + signable.version + signable.header + signable.body)


def random_request(rng: random.Random) -> tuple[RequestSpec, tuple[int, ...]]:
    prompt = tuple(rng.randrange(1 << 32) for _ in range(rng.randrange(1, 40)))
    output = tuple(rng.randrange(1 << 32) for _ in range(rng.randrange(0, 40)))
    spec = RequestSpec(
        prompt,
        rng.randrange(1 << 64),
        rng.randrange(1 << 32),
        rng.randrange(1 << 32),
        rng.randrange(1 << 32),
        rng.randrange(1 << 32),
        tuple(sorted(rng.sample(range(1 << 32), rng.randrange(0, 4)))),  # stop tokens, some with none
    )
    return spec, output


def test_hashes_match_the_contract(chain):
    rng = random.Random(7)
    for _ in range(N_RANDOM_CASES):
        spec, output = random_request(rng)
        assert chain.client.call("hashRequest", list(spec.prompt), spec.params_tuple()) == spec.hash()
        assert chain.client.call("hashOutput", list(output)) == hash_tokens(output)
    assert hash_tokens(()) == keccak(b"")  # the contract's empty-array convention


def test_receipt_digest_and_signature_both_ways(chain, tmp_path):
    operator, key = new_operator(chain, tmp_path)
    rng = random.Random(11)
    for _ in range(N_RANDOM_CASES // 2):
        spec, output = random_request(rng)
        signed = operator.sign(spec, output)
        signed.check()
        # Python digest == contract digest
        assert digest_of(receipt_signable(chain.client.domain, signed.receipt)) == chain.client.receipt_digest(
            signed.receipt
        )
        # signed in Python, verified on chain
        assert chain.client.receipt_signer(signed.receipt, signed.signature) == operator.address
        # the contract's digest signed raw, verified in Python
        raw = Account.unsafe_sign_hash(chain.client.receipt_digest(signed.receipt), key).signature
        assert recover_receipt_signer(chain.client.domain, signed.receipt, bytes(raw)) == operator.address


def test_verdict_digest_matches_the_contract(chain):
    cases = (
        (1, b"\x01" * 32, 0, dev_address(5), True),
        (2, b"\xab" * 32, 7, dev_address(6), False),
        (2**200, keccak(b"receipt"), 2**32 - 1, dev_address(1), True),
    )
    for cid, receipt_digest, position, challenger, fault in cases:
        disputed = Disputed(cid, receipt_digest, position, challenger)
        assert digest_of(verdict_signable(chain.client.domain, disputed, fault)) == bytes(
            chain.client.call("verdictDigest", cid, receipt_digest, position, challenger, fault)
        )


def test_verdict_digest_names_the_receipt_position_and_challenger(chain):
    """A verdict signs what was challenged, not only the id: change any of them and it is another verdict."""
    base = Disputed(3, b"\x01" * 32, 4, dev_address(5))
    others = (
        replace(base, receipt_digest=b"\x02" * 32),
        replace(base, position=5),
        replace(base, challenger=dev_address(6)),
        replace(base, challenge_id=4),
    )
    digests = {digest_of(verdict_signable(chain.client.domain, d, True)) for d in (base, *others)}
    assert len(digests) == 1 + len(others)


def test_high_s_signature_is_rejected_on_chain(chain, tmp_path):
    operator, _ = new_operator(chain, tmp_path)
    signed = operator.sign(request(seed=99), (1, 2, 3))
    r, s, v = signed.signature[:32], int.from_bytes(signed.signature[32:64], "big"), signed.signature[64]
    malleated = r + (SECPK1_N - s).to_bytes(32, "big") + bytes([55 - v])  # same signer, high s
    with pytest.raises(ChainRevert) as err:
        chain.client.receipt_signer(signed.receipt, malleated)
    assert err.value.name == "ECDSAInvalidSignatureS"


@pytest.mark.parametrize("foreign", ["chain", "contract"])
def test_receipt_for_another_domain_is_rejected(chain, tmp_path, foreign):
    operator, key = new_operator(chain, tmp_path)
    here = chain.client.domain
    other = Domain(1, here.contract) if foreign == "chain" else Domain(here.chain_id, "0x" + "11" * 20)
    spec, output = request(seed=5), (3, 4, 5, 6)
    signed = sign_raw(key, chain, spec, output, operator.model_hash, domain=other)
    signed.check()  # self-consistent in its own domain ...
    assert chain.client.receipt_signer(signed.receipt, signed.signature) != operator.address  # ... not in ours
    with pytest.raises(ChainRevert) as err:
        chain.client.challenge(Account.from_key(key).key, signed, 0)
    assert err.value.name == "InvalidReceiptSigner"
    honest = operator.sign(replace(spec, seed=6), output)
    twin = SignedReceipt(here, signed.receipt, signed.signature, spec, output)  # claims our domain
    with pytest.raises(ReceiptError):
        twin.check()
    with pytest.raises(ChainRevert) as err:
        chain.client.slash_equivocation(key, honest, twin)
    assert err.value.name in {"InvalidReceiptSigner", "RequestHashesDiffer"}


def test_equivocation_is_slashed(chain, tmp_path):
    operator, key = new_operator(chain, tmp_path)
    spec = request(seed=123)
    a = sign_raw(key, chain, spec, (1, 2, 3, 4), operator.model_hash)
    b = sign_raw(key, chain, spec, (1, 2, 3, 5), operator.model_hash)
    cfg = chain.client.config()
    treasury = chain.client.call("treasury")
    reporter = dev_address(6)  # anyone may report; the reporter needs no bond or registration
    treasury_before, reporter_before = chain.client.credits(treasury), chain.client.credits(reporter)
    tx = chain.client.slash_equivocation(dev_key(6), a, b)
    (proven,) = chain.client.decode_events(tx, "EquivocationProven")
    (slashed,) = chain.client.decode_events(tx, "OperatorSlashed")
    assert proven["operator"] == operator.address and proven["outputHashA"] != proven["outputHashB"]
    assert slashed["amount"] == cfg.slash_amount
    assert slashed["reporterReward"] == cfg.slash_amount * cfg.challenger_reward_bps // 10_000
    assert chain.client.operator_info(operator.address).bond == cfg.min_bond - cfg.slash_amount
    assert chain.client.credits(treasury) - treasury_before == slashed["treasuryShare"]
    assert chain.client.credits(reporter) - reporter_before == slashed["reporterReward"]
    with pytest.raises(ChainRevert) as err:  # once per (operator, request)
        chain.client.slash_equivocation(dev_key(6), a, b)
    assert err.value.name == "EquivocationAlreadySlashed"


def test_operator_never_signs_two_outputs_and_keeps_receipts_across_restarts(chain, tmp_path):
    operator, _ = new_operator(chain, tmp_path)
    spec = request(seed=77)
    first = operator.sign(spec, (9, 9, 9))
    again = operator.sign(spec, (9, 9, 8))  # e.g. float noise flipped a near-tie on a second run
    assert again == first and again.output == (9, 9, 9)
    path = tmp_path / "restart.sqlite"
    store = ReceiptStore(path)
    store.put_first(first)
    store.close()
    reopened = ReceiptStore(path)
    assert reopened.get(first.receipt.model_hash, spec.hash()) == first and reopened.count() == 1
    reopened.close()


def test_ensure_bonded_registers_once_and_tops_up_after_a_slash(chain, tmp_path):
    operator, key = new_operator(chain, tmp_path)
    cfg = chain.client.config()
    again = operator.ensure_bonded()
    assert not again.registered_now and again.topped_up == 0 and again.bond == cfg.min_bond
    spec = request(seed=4242)
    chain.client.slash_equivocation(
        dev_key(7),
        sign_raw(key, chain, spec, (1,), operator.model_hash),
        sign_raw(key, chain, spec, (2,), operator.model_hash),
    )
    assert not chain.client.operator_info(operator.address).active
    topped = operator.ensure_bonded()
    assert topped.topped_up == cfg.slash_amount and topped.bond == cfg.min_bond
    assert chain.client.operator_info(operator.address).active


CONCURRENT_OPERATORS = 8  # more than the networked demo's four targets bonding at once


def test_ensure_bonded_many_operators_funded_from_one_account_at_once(chain, tmp_path):
    """Several target nodes starting together all fund their new keys from anvil's account 0: their
    transfers race for the same nonce. Every one must still end up funded and bonded (before the
    fix about half of them died with "nonce too low")."""
    bonded, errors = [], []

    def start_operator() -> None:
        try:
            bonded.append(new_operator(chain, tmp_path)[0])
        except Exception as exc:  # collected and asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=start_operator) for _ in range(CONCURRENT_OPERATORS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == [] and len(bonded) == CONCURRENT_OPERATORS
    min_bond = chain.client.config().min_bond
    for operator in bonded:
        info = chain.client.operator_info(operator.address)
        assert info.active and info.bond == min_bond


def test_receipt_json_round_trip_and_rejects_malformed(chain, tmp_path):
    operator, _ = new_operator(chain, tmp_path)
    signed = operator.sign(request(seed=31), (1, 2))
    assert SignedReceipt.from_json(signed.to_json()) == signed
    good = signed.to_json()
    bad_cases = [
        {**good, "format": 1},  # before store nonces: refused, not misread
        {**good, "format": 2},  # before stop tokens: refused, not misread
        {**good, "format": 5},
        {**good, "receipt": {k: v for k, v in good["receipt"].items() if k != "store_nonce"}},
        {**good, "receipt": {**good["receipt"], "store_nonce": 2**64}},
        {**good, "signature": "0x1234"},
        {**good, "output": [1, -2]},
        {**good, "output": "12"},
        {**good, "receipt": {**good["receipt"], "model_hash": "0x12"}},
        {**good, "receipt": {**good["receipt"], "operator": "not an address"}},
        {**good, "request": {**good["request"], "seed": 2**64}},
        {**good, "request": {**good["request"], "top_k": True}},
        {**good, "request": {k: v for k, v in good["request"].items() if k != "stop_tokens"}},
        {**good, "request": {**good["request"], "stop_tokens": [7, 3]}},  # not ascending
        {**good, "request": {**good["request"], "stop_tokens": [3, 3]}},  # duplicates
        {**good, "request": {**good["request"], "stop_tokens": list(range(17))}},  # too many
        {**good, "request": {**good["request"], "stop_sequences": ["a", "b", "c", "d", "e"]}},  # too many
        {**good, "request": {**good["request"], "stop_sequences": [""]}},
        {**good, "request": {**good["request"], "stop_sequences": ["x" * 65]}},  # too long
        {**good, "request": {**good["request"], "stop_sequences": "\n"}},  # one string: a list of them
        {**good, "request": {**good["request"], "stop_sequences": [7]}},
        {k: v for k, v in good.items() if k != "request"},
        [good],
    ]
    for bad in bad_cases:
        with pytest.raises(ReceiptError):
            SignedReceipt.from_json(bad)
    tampered = SignedReceipt.from_json({**good, "output": [1, 3]})
    with pytest.raises(ReceiptError, match="output"):
        tampered.check()


def test_the_stop_rule_is_part_of_the_request_hash_and_checkable():
    """Two requests that differ only in their stop rule hash apart (a receipt names the rule that
    ended its answer), and ``ended_by_rule`` tells an answer cut short or run past a stop token."""
    ignore = RequestSpec.build([1, 2], SamplingParams(), 3, 4)
    stops = RequestSpec.build([1, 2], SamplingParams(), 3, 4, stop_tokens=[9, 8])
    assert stops.stop_tokens == (8, 9) and ignore.hash() != stops.hash()
    assert ignore.ended_by_rule((5, 9, 5, 5)) and not ignore.ended_by_rule((5, 9))  # runs to max_tokens
    assert stops.ended_by_rule((5, 9)) and stops.ended_by_rule((5, 5, 5, 5)) and stops.ended_by_rule((8,))
    assert not stops.ended_by_rule((5, 9, 5)) and not stops.ended_by_rule((5, 5)) and not stops.ended_by_rule(())


def test_a_format_3_receipt_still_reads_as_one_without_stop_sequences(chain, tmp_path):
    operator, _ = new_operator(chain, tmp_path)
    signed = operator.sign(request(seed=32), (1, 2))
    old = signed.to_json()
    old["format"] = 3
    del old["request"]["stop_sequences"]
    assert SignedReceipt.from_json(old) == signed


def test_stop_sequences_are_part_of_the_request_hash_as_the_contract_hashes_them(chain):
    """``stop_hash`` is SpecmarketBond.hashStopRule, read from the deployed contract: tokens alone
    hash as before stop sequences existed; sequences change the hash, their order too."""
    cases = [((), ()), ((151643,), ()), ((8, 9), ("\n\n",)), ((8, 9), ("x", "\n\n")), ((), ("é", "END"))]
    for tokens, sequences in cases:
        want = bytes(chain.client.call("hashStopRule", (list(tokens), list(sequences))))
        assert stop_hash(tokens, sequences) == want, (tokens, sequences)
    plain = RequestSpec.build([1, 2], SamplingParams(), 3, 4, stop_tokens=[9])
    with_stop = RequestSpec.build([1, 2], SamplingParams(), 3, 4, stop_tokens=[9], stop_sequences=["\n\n"])
    assert plain.hash() != with_stop.hash() and plain.stop_hash() == hash_tokens([9])


def test_a_stop_sequence_ends_the_answer_at_the_token_that_completes_it():
    """The text of the tokens so far decides: the answer ends with the token whose text completes a
    stop sequence first; before it, the rule does not end it; past it, it ran on."""
    vocab = {1: "a", 2: "\n", 3: "b", 4: "\n\nc"}

    def text(tokens) -> str:
        return "".join(vocab[t] for t in tokens)

    spec = RequestSpec.build([1], SamplingParams(), 3, 8, stop_sequences=["\n\n"])
    assert spec.end_of((1, 2, 2, 3), text) == 3 and spec.ended_by_rule((1, 2, 2), text)
    assert not spec.ended_by_rule((1, 2), text) and not spec.ended_by_rule((1, 2, 2, 3), text)  # early; past it
    assert spec.end_of((1, 4, 3), text) == 2  # completed inside one token's text
    assert spec.ended_by_rule((1,) * 8, text)  # no stop sequence: max_tokens
    with pytest.raises(ReceiptError, match="needs the tokenizer"):
        spec.ended_by_rule((1, 2, 2))


def test_quantized_params_are_what_the_receipt_names():
    params = SamplingParams(0.7000004, 5, 0.9)
    spec = RequestSpec.build([1], params, 3, 8)
    assert spec.temperature_micros == 700_000 and spec.top_p_micros == 900_000
    assert spec.params == quantize(params) and spec.params.temperature == 700_000 / MICROS
