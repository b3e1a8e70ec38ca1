"""Clients check what a receipt covers (issue: hardening), against a real anvil.

An operator that answers a cheaper request (fewer tokens, a shorter prompt, another seed or
temperature) honestly and signs that, signs for another deployment, is not (or no longer) bonded,
is bonded for another model, or hands out a receipt whose challenge window is running out, is
caught by the client before it trusts the answer. Before, ``specmarket ask`` checked only the
signature and the hashes, so every one of these receipts passed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from chainutil import chain_now, deployed_chain, new_operator, sign_raw, warp
from eth_account import Account

from node.chain.receipts import RECEIPT_FRESH_S, Domain, ReceiptError, RequestSpec
from node.client.receipt_check import CLOCK_SLACK_S, Asked, check_covers, check_on_chain
from verifier.params import SamplingParams

MODEL = b"\x42" * 32  # new_operator's committed model
PROMPT = (0, 5, 6, 7)
OUTPUT = (8, 9, 10, 11)
ASKED = Asked(PROMPT, SamplingParams(0.8, 0, 0.9), seed=3, max_tokens=8)


def _spec(asked: Asked = ASKED, **changes) -> RequestSpec:
    spec = RequestSpec.build(asked.prompt, asked.params, asked.seed or 0, asked.max_tokens)
    return replace(spec, **changes)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A chain of this module's own: a test moves its clock."""
    with deployed_chain(tmp_path_factory.mktemp("check-chain")) as chain:
        yield chain


@pytest.fixture(scope="module")
def operator_key(chain, tmp_path_factory) -> bytes:
    _, key = new_operator(chain, tmp_path_factory.mktemp("check-operator"), MODEL)
    return key


def _signed(chain, key, spec=None, *, issued_at=None, model=MODEL, domain=None, output=OUTPUT):
    issued = chain_now(chain) if issued_at is None else issued_at
    return sign_raw(key, chain, spec or _spec(), output, model, domain=domain, issued_at=issued)


def test_an_honest_receipt_passes_every_check_succeeds(chain, operator_key):
    signed = _signed(chain, operator_key)
    check_covers(signed, ASKED, list(OUTPUT))
    check_on_chain(signed, chain.client, MODEL)
    drawn = _signed(chain, operator_key, _spec(seed=77))  # no seed asked: the target's draw is accepted
    check_covers(drawn, replace(ASKED, seed=None), list(OUTPUT))


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"max_tokens": 4}, "max_tokens 4 (asked 8)"),  # a cheaper request: fewer tokens
        ({"prompt": PROMPT[:2]}, "a prompt of 2 tokens (asked 4)"),  # a shorter prompt
        ({"seed": 4}, "seed 4 (asked 3)"),
        ({"temperature_micros": 0}, "temperature_micros 0 (asked 800000)"),  # greedy is cheaper to fake
        ({"top_p_micros": 1_000_000}, "top_p_micros 1000000 (asked 900000)"),
    ],
)
def test_a_receipt_for_another_request_is_refused_reverts(chain, operator_key, changes, named):
    signed = _signed(chain, operator_key, _spec(**changes))
    signed.check()  # signature and hashes hold: before, this was all `ask` checked
    with pytest.raises(ReceiptError, match="another request") as caught:
        check_covers(signed, ASKED, list(OUTPUT))
    assert named in str(caught.value)


def test_a_receipt_for_other_tokens_is_refused_reverts(chain, operator_key):
    with pytest.raises(ReceiptError, match="tokens received"):
        check_covers(_signed(chain, operator_key), ASKED, [*OUTPUT, 12])


def test_a_receipt_for_another_deployment_is_refused_reverts(chain, operator_key):
    elsewhere = Domain(chain.client.domain.chain_id, "0x" + "11" * 20)
    with pytest.raises(ReceiptError, match="not the deployment this client trusts"):
        check_on_chain(_signed(chain, operator_key, domain=elsewhere), chain.client, MODEL)


def test_a_receipt_of_an_unbonded_operator_is_refused_reverts(chain, tmp_path):
    stranger = bytes(Account.create().key)  # never registered: nobody could hold it to anything
    with pytest.raises(ReceiptError, match="not registered on chain"):
        check_on_chain(_signed(chain, stranger), chain.client, MODEL)
    _, leaving = new_operator(chain, tmp_path, MODEL)
    chain.client.send(leaving, "requestUnbond")
    with pytest.raises(ReceiptError, match="unbonding on chain"):
        check_on_chain(_signed(chain, leaving), chain.client, MODEL)


def test_a_receipt_for_another_model_is_refused_reverts(chain, operator_key):
    with pytest.raises(ReceiptError, match="not the expected"):
        check_on_chain(_signed(chain, operator_key, model=b"\x43" * 32), chain.client, MODEL)
    with pytest.raises(ReceiptError, match="not the expected"):  # the client expects another model
        check_on_chain(_signed(chain, operator_key), chain.client, b"\x43" * 32)


def test_a_stale_or_future_receipt_is_refused_reverts(chain, operator_key):
    signed = _signed(chain, operator_key)
    warp(chain, RECEIPT_FRESH_S + 5)
    with pytest.raises(ReceiptError, match="challenge window is running out"):
        check_on_chain(signed, chain.client, MODEL)
    future = _signed(chain, operator_key, issued_at=chain_now(chain) + CLOCK_SLACK_S + 120)
    with pytest.raises(ReceiptError, match="future"):
        check_on_chain(future, chain.client, MODEL)
