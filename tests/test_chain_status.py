"""`specmarket chain status` lists each challenge an operator can act on (issue 14, item 4), against
a real anvil: its id, operator, position, state and deadline, newest first, with every amount in
ETH. It used to print only a count of challenges, and the challenger bond in raw wei.

The module's chain holds one challenge in each state: at fault and cleared (resolved with verdicts
signed by the dev referees' keys, no model needed), refunded and refundable (past the resolve
window, which a clock warp closes), and one still open against a second operator.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest
from chainutil import challenge_now, deployed_chain, new_operator, request, warp
from eth_account import Account

from node.chain import ChainError
from node.chain.anvil import free_port
from node.chain.challenges import challenge_rows
from node.chain.client import connect
from node.chain.deployment import DEV_CHALLENGER, DEV_REFEREES, BondConfig, dev_address, dev_key
from node.chain.receipts import Disputed, sign_verdict
from node.runtime.redact import shown_url

RESOLVE_TIMEOUT_S = 600
MODEL = b"\x42" * 32  # new_operator's default model hash
OUTPUT = (1, 2, 3, 4)  # request()'s max_tokens
TIMEOUT_S = 180
RAW_WEI = re.compile(r"\b\d{12,}\b")  # a bare number this long is an amount in wei (0.1 ETH = 10**17)


@dataclass(frozen=True)
class Disputes:
    accused: str  # the operator of every challenge but the open one
    other: str  # the open one's operator
    ids: dict[str, int]  # state -> challenge id


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A chain of this module's own: the fixture moves its clock."""
    with deployed_chain(tmp_path_factory.mktemp("status-chain"), BondConfig(resolve_timeout=RESOLVE_TIMEOUT_S)) as c:
        yield c


def _resolve(chain, cid: int, at_fault: bool) -> None:
    (event,) = chain.client.events("ChallengeOpened", id=cid)
    disputed = Disputed.from_event(event)
    referees = DEV_REFEREES[:2]  # the deployment's threshold
    sigs = {dev_address(i): sign_verdict(dev_key(i), chain.client.domain, disputed, at_fault) for i in referees}
    chain.client.resolve(dev_key(referees[0]), cid, at_fault, sigs)


@pytest.fixture(scope="module")
def disputes(chain, tmp_path_factory) -> Disputes:
    tmp = tmp_path_factory.mktemp("operators")
    (_, key), (_, other_key) = new_operator(chain, tmp), new_operator(chain, tmp)
    at_fault, cleared, refunded, refundable = (
        challenge_now(chain, key, MODEL, request(seed=seed), OUTPUT) for seed in range(1, 5)
    )
    _resolve(chain, at_fault, True)
    _resolve(chain, cleared, False)
    warp(chain, RESOLVE_TIMEOUT_S + 1)  # the other two are past their deadline
    chain.client.send(dev_key(DEV_CHALLENGER), "refundExpired", refunded)
    still_open = challenge_now(chain, other_key, MODEL, request(seed=5), OUTPUT)
    ids = {
        "operator at fault": at_fault,
        "operator cleared": cleared,
        "expired (refunded)": refunded,
        "refundable": refundable,
        "open": still_open,
    }
    return Disputes(Account.from_key(key).address, Account.from_key(other_key).address, ids)


def _status(chain, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "node", "chain", "status", *chain.cli_args(), *extra],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_chain_status_table_shows_each_challenge_and_every_amount_in_eth(chain, disputes):
    out = _status(chain)
    for state, cid in disputes.ids.items():
        operator = disputes.other if state == "open" else disputes.accused
        row = rf"^\s*{cid}\s+{operator}\s+0\s+{re.escape(state)}\s+0\.1 ETH\s+\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
        assert re.search(row, out, re.MULTILINE), f"no row for challenge {cid} ({state}) in:\n{out}"
    assert re.search(rf"^\s*{disputes.ids['open']}\s.*\(in \d+ (s|min)\)$", out, re.MULTILINE)  # time left
    assert "challenges: 5" in out
    assert f"`specmarket chain refund {disputes.ids['refundable']}`" in out
    assert f"chain refund {disputes.ids['expired (refunded)']}`" not in out  # refunded already
    assert "min bond 1 ETH" in out and "slash 1 ETH" in out and "challenger bond 0.1 ETH" in out
    assert f"{disputes.accused}  inactive  bond 0 ETH  open challenges 1" in out  # slashed; one refundable left
    for amount, unit in re.findall(r"\b(?:bond|slash) (\d[\d.]*)( ETH)?", out):
        assert unit, f"an amount without its unit: {amount}"
    assert not RAW_WEI.search(out), out


def test_chain_status_json_of_one_operator_lists_its_challenges_newest_first_in_eth(chain, disputes):
    out = _status(chain, "--json", "--operator", disputes.accused.lower())
    shown = json.loads(out)
    ids = disputes.ids
    newest_first = ["refundable", "expired (refunded)", "operator cleared", "operator at fault"]
    assert [(c["id"], c["state"]) for c in shown["challenges"]] == [(ids[state], state) for state in newest_first]
    assert shown["challenge_count"] == 4
    for c in shown["challenges"]:
        assert c["operator"] == disputes.accused and c["position"] == 0 and c["bond"] == "0.1 ETH"
        assert c["deadline"] == c["opened_at"] + RESOLVE_TIMEOUT_S and c["challenger"] == dev_address(DEV_CHALLENGER)
    cfg = shown["config"]
    assert (cfg["min_bond"], cfg["challenger_bond"], cfg["slash_amount"]) == ("1 ETH", "0.1 ETH", "1 ETH")
    assert shown["operators"][disputes.other]["bond"] == "1 ETH"
    assert not RAW_WEI.search(out), out


def test_challenge_rows_are_newest_first_bounded_by_limit_and_filtered_by_operator(chain, disputes):
    ids = disputes.ids
    rows = challenge_rows(chain.client, limit=2)
    assert [(r.id, r.state) for r in rows] == [(ids["open"], "open"), (ids["refundable"], "refundable")]
    record = chain.client.challenge_record(rows[0].id)
    assert rows[0].operator == disputes.other and rows[0].opened_at == record["created_at"]
    assert rows[0].deadline == record["created_at"] + RESOLVE_TIMEOUT_S
    assert rows[0].bond_wei == chain.client.config().challenger_bond
    assert rows[0].to_json()["bond"] == "0.1 ETH" and "bond_wei" not in rows[0].to_json()
    accused = challenge_rows(chain.client, disputes.accused, limit=3)
    assert [r.id for r in accused] == [ids["refundable"], ids["expired (refunded)"], ids["operator cleared"]]
    assert challenge_rows(chain.client, disputes.other) == [rows[0]]
    assert challenge_rows(chain.client, limit=0) == []
    with pytest.raises(ChainError, match="not an operator address"):
        challenge_rows(chain.client, "0xnot-an-address")


@pytest.mark.parametrize(
    "rpc,shown",
    [
        ("http://127.0.0.1:8545", "http://127.0.0.1:8545"),
        ("https://eth-mainnet.example.com/v2/SECRETKEY", "https://eth-mainnet.example.com/…"),
        ("https://user:SECRETKEY@rpc.example.com:8443/", "https://rpc.example.com:8443/…"),
        ("https://rpc.example.com/?apikey=SECRETKEY", "https://rpc.example.com/…"),
        ("not a url SECRETKEY", "<a URL>"),
    ],
)
def test_an_rpc_url_is_shown_without_its_api_key(rpc, shown):
    """Hosted RPC endpoints carry an API key in the URL; logs and errors used to print it whole."""
    assert shown_url(rpc) == shown


def test_a_chain_that_does_not_answer_is_named_without_its_key():
    with pytest.raises(ChainError) as info:
        connect(f"http://127.0.0.1:{free_port()}/v2/SECRETKEY")  # nothing listens there
    assert "SECRETKEY" not in str(info.value) and "127.0.0.1" in str(info.value)
