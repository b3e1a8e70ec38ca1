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
from node.client.chain_view import ChainView
from node.client.receipt_check import CLOCK_SLACK_S, Asked, check_covers, check_on_chain
from verifier.params import SamplingParams

MODEL = b"\x42" * 32  # new_operator's committed model
PROMPT = (0, 5, 6, 7)
STOPS = (11, 12)  # the model's end-of-sequence tokens, as the client knows them
OUTPUT = (8, 9, 10, 11)  # ended by its stop rule: at the first stop token
ASKED = Asked(PROMPT, SamplingParams(0.8, 0, 0.9), seed=3, max_tokens=8, stop_tokens=STOPS)


def _spec(asked: Asked = ASKED, **changes) -> RequestSpec:
    spec = RequestSpec.build(asked.prompt, asked.params, asked.seed or 0, asked.max_tokens, asked.stop_tokens)
    return replace(spec, **changes)


def _view(chain) -> ChainView:
    """The chain as `specmarket ask` reads it: plain JSON-RPC, the deployment recorded for it."""
    return ChainView.connect(chain.rpc, chain.deployments)


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
    check_on_chain(signed, _view(chain), MODEL)
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
        ({"stop_tokens": ()}, "stop_tokens () (asked (11, 12))"),  # the stop rule is part of the request
    ],
)
def test_a_receipt_for_another_request_is_refused_reverts(chain, operator_key, changes, named):
    signed = _signed(chain, operator_key, _spec(**changes))
    signed.check()  # signature and hashes hold: before, this was all `ask` checked
    with pytest.raises(ReceiptError, match="another request") as caught:
        check_covers(signed, ASKED, list(OUTPUT))
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("output", "asked"),
    [
        ((8, 9, 10), ASKED),  # cut short: no stop token, fewer than max_tokens
        ((8, 11, 9, 10), ASKED),  # run past a stop token
        ((8, 9), replace(ASKED, stop_tokens=())),  # ignore_eos: it must run to max_tokens
    ],
)
def test_an_answer_that_breaks_its_stop_rule_is_refused_reverts(chain, operator_key, output, asked):
    """The receipt covers exactly the tokens sent and the request made, yet the answer does not end
    where the rule it names ends it: an operator that truncates (cheaper) is caught by the client."""
    signed = _signed(chain, operator_key, _spec(asked), output=output)
    signed.check()
    with pytest.raises(ReceiptError, match="does not end where its stop rule ends it"):
        check_covers(signed, asked, list(output))


def test_an_answer_ended_by_its_rule_passes_succeeds(chain, operator_key):
    full = tuple(range(20, 28))  # no stop token: runs to max_tokens
    check_covers(_signed(chain, operator_key, output=full), ASKED, list(full))
    ignoring = replace(ASKED, stop_tokens=())
    past = (11, 12, 11, 12, 11, 12, 11, 12)  # with ignore_eos, stop tokens are ordinary tokens
    check_covers(_signed(chain, operator_key, _spec(ignoring), output=past), ignoring, list(past))


def test_a_receipt_for_other_tokens_is_refused_reverts(chain, operator_key):
    with pytest.raises(ReceiptError, match="tokens received"):
        check_covers(_signed(chain, operator_key), ASKED, [*OUTPUT, 12])


def test_a_receipt_for_another_deployment_is_refused_reverts(chain, operator_key):
    elsewhere = Domain(chain.client.domain.chain_id, "0x" + "11" * 20)
    with pytest.raises(ReceiptError, match="not the deployment this client trusts"):
        check_on_chain(_signed(chain, operator_key, domain=elsewhere), _view(chain), MODEL)


def test_a_receipt_of_an_unbonded_operator_is_refused_reverts(chain, tmp_path):
    stranger = bytes(Account.create().key)  # never registered: nobody could hold it to anything
    with pytest.raises(ReceiptError, match="not registered on chain"):
        check_on_chain(_signed(chain, stranger), _view(chain), MODEL)
    _, leaving = new_operator(chain, tmp_path, MODEL)
    chain.client.send(leaving, "requestUnbond")
    with pytest.raises(ReceiptError, match="unbonding on chain"):
        check_on_chain(_signed(chain, leaving), _view(chain), MODEL)


def test_a_receipt_for_another_model_is_refused_reverts(chain, operator_key):
    with pytest.raises(ReceiptError, match="not the expected"):
        check_on_chain(_signed(chain, operator_key, model=b"\x43" * 32), _view(chain), MODEL)
    with pytest.raises(ReceiptError, match="not the expected"):  # the client expects another model
        check_on_chain(_signed(chain, operator_key), _view(chain), b"\x43" * 32)


def test_a_stale_or_future_receipt_is_refused_reverts(chain, operator_key):
    signed = _signed(chain, operator_key)
    warp(chain, RECEIPT_FRESH_S + 5)
    with pytest.raises(ReceiptError, match="challenge window is running out"):
        check_on_chain(signed, _view(chain), MODEL)
    future = _signed(chain, operator_key, issued_at=chain_now(chain) + CLOCK_SLACK_S + 120)
    with pytest.raises(ReceiptError, match="future"):
        check_on_chain(future, _view(chain), MODEL)


def test_without_model_files_the_operator_is_checked_for_the_receipts_model_succeeds(chain, operator_key):
    """A client without the model's files (model hash None) still checks the domain, the operator's
    standing and freshness, against the model the receipt names."""
    check_on_chain(_signed(chain, operator_key), _view(chain), None)
    with pytest.raises(ReceiptError, match="bonded for another model"):  # bonded for 0x42, signs for 0x43
        check_on_chain(_signed(chain, operator_key, model=b"\x43" * 32), _view(chain), None)
    elsewhere = Domain(chain.client.domain.chain_id, "0x" + "11" * 20)
    with pytest.raises(ReceiptError, match="not the deployment this client trusts"):
        check_on_chain(_signed(chain, operator_key, domain=elsewhere), _view(chain), None)
