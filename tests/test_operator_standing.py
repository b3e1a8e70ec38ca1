"""An operator signs only while the chain says it may, on the chain's clock, and never with a
receipt store that cannot keep it from equivocating (issue: hardening), against a real anvil.

Before: a slashed, unbonding or chain-less operator kept signing receipts as if nothing had
happened; receipts were stamped with the node's clock, and a replayed answer handed out its old
receipt even after its challenge window had run out; a node with a lost receipt store (or a
second node on the same store) could sign a second, different receipt for a request.
"""

from __future__ import annotations

import json
import sqlite3
import threading

import pytest
import trio
from chainutil import chain_now, challenge_now, count_calls, deployed_chain, request, sign_raw, warp
from eth_account import Account
from httputil import metrics, post_json, serving
from httputil import request as http_request

from node.chain.anvil import AnvilProcess, free_port
from node.chain.client import BondClient, ChainRevert, connect, deploy
from node.chain.deployment import DEFAULT_THRESHOLD, DEV_DEPLOYER, DEV_REFEREES, BondConfig, dev_address, dev_key
from node.chain.operator import Operator, OperatorConfig, open_operator
from node.chain.receipts import RECEIPT_FRESH_S
from node.chain.standing import NotServing, StandingWatch
from node.chain.store import STORE_FORMAT, StoreError, open_store
from node.model.loading import TINY_TARGET, model_hash
from node.target.engine import CompletionRequest, Engine
from node.target.http.api import build_app
from node.target.http.dashboard import node_condition

FAST_POLL_S = 0.2


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A chain of this module's own: tests move its clock."""
    with deployed_chain(tmp_path_factory.mktemp("standing-chain")) as chain:
        yield chain


def _operator(chain, tmp_path, committed: bytes = b"\x42" * 32) -> tuple[Operator, bytes]:
    """A bonded operator with its standing watched (the way a target node runs one)."""
    key = bytes(Account.create().key)
    address = Account.from_key(key).address
    store = open_store(tmp_path / f"r-{address}.sqlite", address, chain.client.domain, registered=False)
    operator = Operator(chain.client, key, committed, store)
    operator.ensure_bonded()
    operator.watch = StandingWatch(chain.client, address, committed, poll_s=FAST_POLL_S)
    return operator, key


def test_a_slashed_operator_stops_signing_reverts(chain, tmp_path):
    operator, key = _operator(chain, tmp_path)
    operator.sign(request(seed=1), (1, 2))
    spec = request(seed=2)
    chain.client.slash_equivocation(
        dev_key(7),
        sign_raw(key, chain, spec, (1,), operator.model_hash),
        sign_raw(key, chain, spec, (2,), operator.model_hash),
    )
    standing = operator.watch.check()
    assert not standing.serving and "slashed" in standing.reason
    with pytest.raises(NotServing, match="slashed"):
        operator.sign(request(seed=3), (1, 2))
    assert operator.describe()["serving"] is False and "slashed" in operator.describe()["reason"]
    operator.ensure_bonded()  # topping the bond up does not make the node forget the slash
    assert not operator.watch.check().serving
    operator.close()


def test_an_unbonding_operator_stops_signing_reverts(chain, tmp_path):
    operator, key = _operator(chain, tmp_path)
    chain.client.send(key, "requestUnbond")
    assert "unbonding" in operator.watch.check().reason
    with pytest.raises(NotServing, match="unbonding"):
        operator.sign(request(seed=4), (1,))
    operator.close()


def test_an_operator_without_a_chain_stops_signing_reverts(tmp_path):
    with AnvilProcess(free_port()) as anvil:
        w3 = connect(anvil.url)
        referees = [dev_address(i) for i in DEV_REFEREES]
        deployment, _ = deploy(w3, dev_key(DEV_DEPLOYER), BondConfig(), referees, DEFAULT_THRESHOLD)
        client = BondClient(w3, deployment.address)
        key = bytes(Account.create().key)
        address = Account.from_key(key).address
        operator = Operator(
            client, key, b"\x42" * 32, open_store(tmp_path / "r.sqlite", address, client.domain, registered=False)
        )
        operator.ensure_bonded()
        operator.watch = StandingWatch(client, address, b"\x42" * 32, poll_s=FAST_POLL_S)
        operator.sign(request(seed=5), (1,))
    standing = operator.watch.check()  # anvil is gone
    assert not standing.serving and "does not answer" in standing.reason
    described = operator.describe()  # what /health shows: not ok, and why
    assert described["chain_reachable"] is False and node_condition({"operator": described})[0] == "unavailable"
    with pytest.raises(NotServing, match="does not answer"):
        operator.sign(request(seed=6), (1,))
    operator.close()


def test_receipts_use_the_chain_clock_and_replays_are_re_signed_when_old_succeeds(chain, tmp_path):
    operator, _ = _operator(chain, tmp_path)
    warp(chain, 2 * RECEIPT_FRESH_S)  # the chain's clock now runs ahead of this machine's
    operator.watch.check()
    first = operator.sign(request(seed=7), (3, 4))
    assert abs(first.receipt.issued_at - chain_now(chain)) <= 2  # chain time, not local time
    warp(chain, RECEIPT_FRESH_S + 10)
    operator.watch.check()
    replayed = operator.sign(request(seed=7), (3, 5))  # e.g. float noise: the stored answer stands
    assert replayed.output == first.output and replayed.receipt.output_hash == first.receipt.output_hash
    assert replayed.receipt.issued_at >= first.receipt.issued_at + RECEIPT_FRESH_S  # fresh: challengeable
    replayed.check()
    assert operator.lookup(request(seed=7)) == replayed  # stored: the next replay within the window reuses it
    operator.close()


def test_a_node_that_may_not_sign_refuses_jobs_with_503_succeeds(chain, pair, tmp_path):
    operator, key = _operator(chain, tmp_path, model_hash(TINY_TARGET))
    engine = Engine(pair, model_name="t", gamma=4, operator=operator)
    with serving({"bonded": build_app(engine, lambda: {"operator": operator.describe()})}) as urls:
        ok, _ = post_json(urls["bonded"], {"prompt": "x =", "max_tokens": 2, "seed": 1})
        assert ok == 200
        chain.client.send(key, "requestUnbond")
        operator.watch.check()
        status, body = post_json(urls["bonded"], {"prompt": "x =", "max_tokens": 2, "seed": 2})
        assert status == 503 and "unbonding" in body["error"]["message"]
        code, _, health = http_request(urls["bonded"], "GET", "/health")
        assert code == 503 and json.loads(health)["status"] == "unavailable"
        assert json.loads(health)["operator"]["unbonding"] is True and "unbonding" in json.loads(health)["reason"]
    assert engine.counters.snapshot()["active_jobs"] == 0
    operator.close()


def test_health_and_metrics_show_the_bond_and_turn_unavailable_once_slashed(chain, pair, tmp_path):
    """/health said "ok" for a slashed operator, and neither it nor /metrics carried the bond,
    the standing or a count of receipts signed."""
    operator, key = _operator(chain, tmp_path, model_hash(TINY_TARGET))
    engine = Engine(pair, model_name="t", gamma=4, operator=operator)
    with serving({"bonded": build_app(engine, lambda: {"operator": operator.describe()})}) as urls:
        assert post_json(urls["bonded"], {"prompt": "x =", "max_tokens": 2, "seed": 1})[0] == 200
        code, _, raw = http_request(urls["bonded"], "GET", "/health")
        health = json.loads(raw)
        bonded = health["operator"]
        assert code == 200 and health["status"] == "ok" and health["reason"] == ""
        assert bonded["bond_wei"] == chain.client.config().min_bond and bonded["active"] and not bonded["unbonding"]
        assert bonded["chain_reachable"] and bonded["receipts_signed"] == 1
        samples, _, _ = metrics(urls["bonded"])
        assert samples["specmarket_operator_serving"] == samples["specmarket_operator_active"] == 1
        assert samples["specmarket_receipts_signed_total"] == 1 and samples["specmarket_chain_reachable"] == 1
        assert samples["specmarket_operator_bond_wei"] == bonded["bond_wei"] and bonded["challenges"] == []
        challenged = challenge_now(chain, key, operator.model_hash, request(seed=3), (1, 2))
        operator.watch.check()
        (row,) = json.loads(http_request(urls["bonded"], "GET", "/health")[2])["operator"]["challenges"]
        assert row["id"] == challenged and row["state"] == "open" and row["position"] == 0
        assert row["deadline"] == row["opened_at"] + chain.client.config().resolve_timeout
        spec = request(seed=2)
        twins = [sign_raw(key, chain, spec, (t,), operator.model_hash) for t in (1, 2)]
        chain.client.slash_equivocation(dev_key(7), *twins)
        operator.watch.check()
        code, _, raw = http_request(urls["bonded"], "GET", "/health")
        health = json.loads(raw)
        assert code == 503 and health["status"] == "unavailable" and "slashed" in health["reason"]
        assert health["operator"]["bond_wei"] < bonded["bond_wei"]
        samples, _, _ = metrics(urls["bonded"])
        assert samples["specmarket_operator_serving"] == 0
    operator.close()


def test_the_watch_reads_the_immutable_resolve_timeout_once_not_on_every_look_succeeds(chain, tmp_path):
    """Each look that had challenges to show read the contract's resolveTimeout again."""
    operator, key = _operator(chain, tmp_path)
    challenge_now(chain, key, operator.model_hash, request(seed=4), (1, 2))
    client = BondClient(connect(chain.rpc), chain.client.address)  # the watch's own, counted
    calls = count_calls(client)
    watch = StandingWatch(client, operator.address, operator.model_hash, poll_s=FAST_POLL_S)
    looks = [watch.check() for _ in range(3)]
    assert all(len(look.challenges) == 1 for look in looks)
    (row,) = looks[-1].challenges
    assert row.deadline == row.opened_at + chain.client.config().resolve_timeout
    assert calls["resolveTimeout"] == 1
    operator.close()


# --- the receipt store ------------------------------------------------------------------------


def test_a_registered_key_with_a_missing_store_is_refused_before_any_transaction_reverts(chain, tmp_path):
    operator, key = _operator(chain, tmp_path)
    operator.close()
    key_file = tmp_path / "operator.key"
    key_file.write_text(key.hex())
    cfg = OperatorConfig(chain.rpc, chain.deployments, key_file)
    block = chain.client.w3.eth.block_number
    with pytest.raises(StoreError, match=r"receipt store .* is missing"):
        open_operator(cfg, TINY_TARGET, tmp_path / "fresh-data-dir")
    assert chain.client.w3.eth.block_number == block  # nothing was sent


def test_a_store_is_held_by_one_process_and_names_its_owner_reverts(chain, tmp_path):
    address, other = Account.create().address, Account.create().address
    path = tmp_path / "receipts.sqlite"
    first = open_store(path, address, chain.client.domain, registered=False)
    with pytest.raises(StoreError, match="another process"):
        open_store(path, address, chain.client.domain, registered=True)
    nonce = first.nonce
    first.close()
    again = open_store(path, address, chain.client.domain, registered=True)  # the same store, after a restart
    assert again.nonce == nonce
    again.close()
    with pytest.raises(StoreError, match="not of operator"):
        open_store(path, other, chain.client.domain, registered=False)
    fresh = open_store(path, other, chain.client.domain, registered=False, new=True)  # forced: moved aside
    aside = [p for p in tmp_path.glob("receipts.sqlite.replaced-*") if p.name.rsplit("-", 1)[1].isdigit()]
    assert fresh.nonce != nonce and len(aside) == 1
    fresh.close()
    kept = open_store(aside[0], address, chain.client.domain, registered=True)  # kept whole, never deleted
    assert kept.nonce == nonce
    kept.close()


def test_a_store_of_the_old_format_is_refused_unless_forced_reverts(chain, tmp_path):
    path = tmp_path / "receipts.sqlite"
    with sqlite3.connect(path) as db:  # what the store looked like before: receipts, no owner
        db.execute(
            "CREATE TABLE receipts (request_hash BLOB PRIMARY KEY, receipt TEXT NOT NULL, created REAL NOT NULL)"
        )
    address = Account.create().address
    with pytest.raises(StoreError, match="predates store format"):
        open_store(path, address, chain.client.domain, registered=True)
    open_store(path, address, chain.client.domain, registered=True, new=True).close()


def test_an_engine_refuses_before_decoding_when_not_serving_reverts(chain, pair, tmp_path):
    operator, key = _operator(chain, tmp_path, model_hash(TINY_TARGET))
    chain.client.send(key, "requestUnbond")
    operator.watch.check()
    engine = Engine(pair, model_name="t", gamma=4, operator=operator)
    with pytest.raises(NotServing):
        trio.run(engine.complete, CompletionRequest("x =", 2, seed=1))
    assert engine.counters.requests == 0  # refused before any work
    operator.close()


def test_two_stores_of_one_key_are_no_equivocation_but_one_store_is_reverts(chain, tmp_path):
    """A lost store or a replica signs under another store nonce: float noise between the two
    answers (here: two different outputs for one request) is not slashable without a referee.
    Within one store, two outputs for one request still are (and the store never signs them)."""
    operator, key = _operator(chain, tmp_path)
    replica = Operator(
        chain.client,
        key,
        operator.model_hash,
        open_store(tmp_path / "replica.sqlite", operator.address, chain.client.domain, registered=True, new=True),
    )
    spec = request(seed=31)
    first, second = operator.sign(spec, (1, 2)), replica.sign(spec, (1, 3))
    assert first.receipt.store_nonce != second.receipt.store_nonce
    with pytest.raises(ChainRevert, match="StoreNoncesDiffer"):
        chain.client.slash_equivocation(dev_key(7), first, second)
    nonce = first.receipt.store_nonce  # a careless operator signing twice from one store is slashed at once
    forged = sign_raw(key, chain, spec, (1, 4), operator.model_hash, store_nonce=nonce)
    chain.client.slash_equivocation(dev_key(7), first, forged)
    assert "slashed" in operator.watch.check().reason
    operator.close()
    replica.close()


def test_a_stored_answer_is_served_only_under_the_model_that_made_it_succeeds(chain, tmp_path):
    """An operator that moves to another model (unbond, withdraw, register the new one) with the
    same key and store answers a request anew under the new model: the old model's answer is never
    re-signed under the new hash (a wrong-token challenge the honest operator would lose), and the
    old receipt is kept. Two receipts for one request under two models are no equivocation."""
    old_model, new_model = b"\x42" * 32, b"\x43" * 32
    operator, key = _operator(chain, tmp_path, old_model)
    spec = request(seed=41)
    old = operator.sign(spec, (1, 2))
    chain.client.send(key, "requestUnbond")
    warp(chain, chain.client.config().unbonding_delay + 1)
    chain.client.send(key, "withdrawBond")
    moved = Operator(chain.client, key, new_model, operator.store)
    assert moved.ensure_bonded().registered_now
    moved.watch = StandingWatch(chain.client, moved.address, new_model, poll_s=FAST_POLL_S)
    warp(chain, 2 * RECEIPT_FRESH_S)  # the old receipt is old now: a replay would be re-signed
    moved.watch.check()
    assert moved.lookup(spec) is None
    answer = moved.sign(spec, (3, 4))
    assert answer.output == (3, 4) and answer.receipt.model_hash == new_model
    answer.check()
    assert moved.store.get(old_model, spec.hash()) == old
    with pytest.raises(ChainRevert) as err:
        chain.client.slash_equivocation(dev_key(7), old, answer)
    assert err.value.name == "ModelHashesDiffer"
    moved.close()


def test_a_store_keyed_by_request_alone_is_rekeyed_by_model_and_keeps_every_receipt_succeeds(chain, tmp_path):
    """A store of format 2 (receipts keyed by request hash alone) opens as format 3: each receipt
    under the model it names, nonce and owner unchanged."""
    operator, _ = _operator(chain, tmp_path)
    signed = operator.sign(request(seed=43), (5, 6))
    operator.close()
    path = tmp_path / "format2.sqlite"
    owner = {"operator": operator.address, "chain_id": chain.client.domain.chain_id}
    owner["contract"] = chain.client.domain.contract
    with sqlite3.connect(path) as db:  # what the store looked like before: receipts keyed by request alone
        db.execute(
            "CREATE TABLE receipts (request_hash BLOB PRIMARY KEY, receipt TEXT NOT NULL, created REAL NOT NULL)"
        )
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        row = (signed.receipt.request_hash, json.dumps(signed.to_json()))
        db.execute("INSERT INTO receipts VALUES (?, ?, 1.0)", row)
        meta = [("format", "2"), ("nonce", "7"), ("owner", json.dumps(owner))]
        db.executemany("INSERT INTO meta VALUES (?, ?)", meta)
    store = open_store(path, operator.address, chain.client.domain, registered=True)
    assert store.get(signed.receipt.model_hash, signed.receipt.request_hash) == signed
    assert store.get(b"\x43" * 32, signed.receipt.request_hash) is None
    assert (store.meta("format"), store.nonce, store.count()) == (str(STORE_FORMAT), 7, 1)
    store.close()


def test_the_engine_looks_up_stored_answers_off_the_trio_thread_succeeds(chain, pair, tmp_path):
    """The receipt store (SQLite) and a stale receipt's re-signature never block the trio loop that
    serves every other client: the engine asks the operator from a worker thread."""
    operator, _ = _operator(chain, tmp_path, model_hash(TINY_TARGET))
    engine = Engine(pair, model_name="t", gamma=4, operator=operator)
    looked_up_in: list[threading.Thread] = []
    lookup = operator.lookup

    def spy(spec):
        looked_up_in.append(threading.current_thread())
        return lookup(spec)

    operator.lookup = spy
    first = trio.run(engine.complete, CompletionRequest("x =", 3, seed=9))
    again = trio.run(engine.complete, CompletionRequest("x =", 3, seed=9))  # answered from the store
    assert again.stats["replayed"] == 1 and again.tokens == first.tokens
    assert looked_up_in and threading.main_thread() not in looked_up_in  # trio.run ran in this one
    operator.close()
