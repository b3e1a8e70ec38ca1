"""Drafters are paid, end to end: a bonded target with a DrafterEscrow on a real anvil, drafter
processes over libp2p on loopback, vouchers in every session's ``settle``, and `specmarket drafter
redeem` cashing them.

The promises tested, each with the attack that would break it:
- an honest drafter is paid exactly price x its accepted tokens (its balance rises by that, less
  gas), and the operator's ledger and the drafter's own wallet agree on the count;
- a hostile drafter earns exactly 0;
- an operator that under-signs is noticed, and after more than one short job the drafter stops
  drafting for it, whatever peer identity it comes back under (the wallet's account is the
  operator's, not the peer's);
- a drafter with --rpc drafts only once its lane on chain covers what it is owed plus the job.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from chainutil import deployed_chain
from eth_account import Account

from node.chain.deployment import dev_address, dev_key, format_ether
from node.chain.escrow import EscrowClient
from node.chain.keys import write_key
from node.drafter.cover import COVER_WAIT_S
from node.drafter.cover_watch import CHAIN_SLACK_S
from node.drafter.terms import account_key
from node.lab.workload import credited
from tests.netutil import SPECMARKET, complete, http_json, start_drafter, start_target, wait_for_drafters

PRICE_WEI = 10**9  # per accepted token
PROMPTS = ["def parse(self, text):\n", "import os\n\n", "class Cache:\n    def __init__(", "for i in range("]
HONEST = {"alice": 6, "bob": 7}  # drafter name -> the anvil dev account it is paid at
AUTO = "bob"  # redeems by itself after every voucher (--redeem-above 0); alice redeems by hand
LIAR = 8
DEADLINE = ("--draft-deadline-ms", "1000")  # correctness never depends on it; CI machines are slow
SETTLE_TIMEOUT_S = 20.0


def wallet(data_dir: Path) -> dict:
    path = data_dir / "wallet.json"
    return json.loads(path.read_text())["accounts"] if path.exists() else {}


def account_of(chain, tmp: Path) -> str:
    """The wallet's key for what the target's operator owes (node.drafter.terms.account_key)."""
    operator = Account.from_key(_operator_key(tmp)).address
    return account_key(chain.client.w3.eth.chain_id, chain.deployment.escrow, operator)


def wait_for_account(data_dir: Path, key: str, done, timeout_s: float = SETTLE_TIMEOUT_S) -> dict:
    """The drafter's account ``key`` once ``done(account)`` holds, or as it is after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        account = wallet(data_dir).get(key, {})
        if done(account) or time.monotonic() > deadline:
            return account
        time.sleep(0.1)


def wait_for_earnings(data_dir: Path, key: str, wei: int) -> dict:
    """The drafter's account ``key`` once its wallet shows ``wei`` earned."""
    return wait_for_account(data_dir, key, lambda account: account.get("earned_wei", 0) >= wei)


def wait_for_verdict(data_dir: Path, key: str) -> dict:
    """The drafter's account ``key`` once its wallet holds a cover verdict (a check concludes within
    COVER_WAIT_S and its chain call's slack)."""
    timeout_s = COVER_WAIT_S + CHAIN_SLACK_S + SETTLE_TIMEOUT_S
    return wait_for_account(data_dir, key, lambda account: bool(account.get("uncovered")), timeout_s)


@pytest.fixture(scope="module")
def paid_net(tmp_path_factory):
    """A paying target (escrow on anvil), two honest drafters and a lying one, each with a payout address."""
    tmp = tmp_path_factory.mktemp("paid")
    with deployed_chain(tmp / "deployments", escrow=True) as chain:
        chain_args = ("--chain", chain.rpc, "--deployments", str(chain.deployments))
        target = start_target(tmp, *chain_args, *DEADLINE, "--drafter-price", str(PRICE_WEI))
        bootstrap = target.lines["multiaddr"][0]
        auto_key = write_key(tmp / f"{AUTO}.key", dev_key(HONEST[AUTO]))  # anvil's public dev key: tests only
        auto = ("--key-file", str(auto_key), "--redeem-above", "0")
        drafters = {
            name: start_drafter(
                tmp,
                bootstrap,
                "honest",
                name,
                "--payout",
                dev_address(i),
                "--rpc",
                chain.rpc,
                *(auto if name == AUTO else ()),
            )
            for name, i in HONEST.items()
        }
        drafters["liar"] = start_drafter(tmp, bootstrap, "lying", "liar", "--payout", dev_address(LIAR))
        try:
            http = target.lines["http"][0]
            wait_for_drafters(http, 3)
            answers = [complete(http, p, seed=s, max_tokens=32, temperature=0.0) for s, p in enumerate(PROMPTS)]
            yield chain, tmp, target, drafters, answers
        finally:
            for node in drafters.values():
                node.stop()
            target.stop()


def peer(node) -> str:
    return node.lines["multiaddr"][0].rsplit("/", 1)[-1]


def test_ledger_and_wallets_agree_and_the_liar_earns_nothing(paid_net):
    chain, tmp, target, drafters, answers = paid_net
    key = account_of(chain, tmp)
    credits = credited(answers)
    assert sum(credits.get(peer(drafters[n]), 0) for n in HONEST) > 0, "no honest token accepted: nothing tested"
    health = http_json(f"{target.lines['http'][0]}/health")
    assert health["operator"]["payments"]["price_wei"] == PRICE_WEI
    for name, node in drafters.items():
        accepted = credits.get(peer(node), 0)
        account = wait_for_earnings(tmp / name, key, PRICE_WEI * accepted)
        assert health["drafters"][peer(node)]["credited_tokens"] == accepted  # the operator's ledger
        assert account.get("earned_wei", 0) == PRICE_WEI * accepted  # the drafter's own account of it
        if name == "liar":
            assert accepted == 0 and not account.get("lanes"), account
        elif accepted:
            (voucher,) = map(json.loads, account["lanes"].values())  # one target: one ledger, one lane
            assert int(voucher["cumulative_wei"]) == PRICE_WEI * accepted
            assert voucher["drafter"] == dev_address(HONEST[name])
            assert account["unpaid_jobs"] == 0


def test_redeem_pays_exactly_the_accepted_tokens(paid_net):
    chain, tmp, _, drafters, answers = paid_net
    credits = credited(answers)
    escrow = EscrowClient(chain.client.w3, chain.deployment.escrow)
    operator = Account.from_key(_operator_key(tmp)).address
    w3 = chain.client.w3
    by_hand = [name for name in HONEST if name != AUTO]
    for name in by_hand:
        accepted = credits.get(peer(drafters[name]), 0)
        wait_for_earnings(tmp / name, account_of(chain, tmp), PRICE_WEI * accepted)
        key_file = write_key(tmp / f"{name}.key", dev_key(HONEST[name]))  # anvil's public dev key: tests only
        before = w3.eth.get_balance(dev_address(HONEST[name]))
        args = ["drafter", "redeem", "--rpc", chain.rpc, "--key-file", str(key_file), "--data-dir", str(tmp / name)]
        out = subprocess.run([*SPECMARKET, *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        if not accepted:
            assert w3.eth.get_balance(dev_address(HONEST[name])) == before
            continue
        tx = re.search(r"tx (0x[0-9a-f]{64})", out.stdout)
        assert tx, out.stdout
        receipt = w3.eth.get_transaction_receipt(tx.group(1))
        gas = receipt["gasUsed"] * receipt["effectiveGasPrice"]
        assert w3.eth.get_balance(dev_address(HONEST[name])) == before + PRICE_WEI * accepted - gas
        assert paid_to(escrow, operator, dev_address(HONEST[name])) == PRICE_WEI * accepted
        again = subprocess.run([*SPECMARKET, *args], capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and "nothing new" in again.stdout, again.stdout  # a replay sends nothing
    # the drafter that redeems by itself was paid every voucher's increment, and no more
    auto_accepted = credits.get(peer(drafters[AUTO]), 0)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while paid_to(escrow, operator, dev_address(HONEST[AUTO])) < PRICE_WEI * auto_accepted:
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    redeemed = escrow.events("Redeemed", drafter=dev_address(HONEST[AUTO]))
    assert sum(e["amount"] for e in redeemed) == paid_to(escrow, operator, dev_address(HONEST[AUTO]))
    assert paid_to(escrow, operator, dev_address(HONEST[AUTO])) == PRICE_WEI * auto_accepted
    status = subprocess.run(
        [*SPECMARKET, "chain", "status", "--json", *chain.cli_args()], capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0, status.stderr[-2000:]
    escrow_rows = json.loads(status.stdout)["escrow"]
    paid = {row["drafter"]: row["paid"] for row in escrow_rows["lanes"]}  # one lane per drafter here
    for name, index in HONEST.items():
        accepted = credits.get(peer(drafters[name]), 0)
        assert paid.get(dev_address(index), "0 ETH") == format_ether(PRICE_WEI * accepted)


def paid_to(escrow: EscrowClient, operator: str, drafter: str) -> int:
    """What ``drafter`` was paid over every lane ``operator`` funded for it."""
    lanes = {int(e["lane"]) for e in escrow.events("LaneFunded", drafter=drafter) if e["operator"] == operator}
    return sum(escrow.lane(operator, drafter, lane).paid for lane in lanes)


def _operator_key(tmp: Path) -> bytes:
    from node.chain.keys import read_key

    return read_key(tmp / "target" / "keys" / "operator.key")


def test_an_underpaying_operator_is_noticed_and_dropped(tmp_path):
    """Cheat.UNDERPAY signs every voucher for half the earnings: the drafter logs each short voucher
    and, after more than one short job, refuses the target's sessions (the target sees refusals).
    Its escrow (0.1 ETH) is below the floor it is given (1 ETH): it warns, and /health says so."""
    with deployed_chain(tmp_path / "deployments", escrow=True) as chain:
        chain_args = ("--chain", chain.rpc, "--deployments", str(chain.deployments), "--cheat", "underpay")
        floor = ("--escrow-floor", "1")
        target = start_target(tmp_path, *chain_args, *DEADLINE, *floor, "--drafter-price", str(PRICE_WEI))
        drafter = start_drafter(tmp_path, target.lines["multiaddr"][0], "honest", "d", "--payout", dev_address(6))
        try:
            http = target.lines["http"][0]
            wait_for_drafters(http, 1)
            payments = http_json(f"{http}/health")["operator"]["payments"]
            assert payments["low"] is True and payments["balance_wei"] <= 10**17, payments
            assert "below the floor" in target.log()
            short_jobs, refused = 0, False
            for seed, prompt in enumerate(PROMPTS * 2):
                answer = complete(http, prompt, seed=seed, max_tokens=32, temperature=0.0)
                time.sleep(0.5)  # the settle reaches the drafter after the answer
                account = wallet(tmp_path / "d").get(account_of(chain, tmp_path), {})
                short_jobs = account.get("unpaid_jobs", 0)
                if short_jobs > 1 and not answer["specmarket"]["credits"]:
                    refused = True
                    break
            assert short_jobs > 1, drafter.log()[-3000:]
            assert refused, "the drafter kept drafting for an operator that under-signs"
            assert "short" in drafter.log() and "unpaid" in drafter.log()
        finally:
            drafter.stop()
            target.stop()
        # the attack: the same operator under a fresh peer identity (a new data dir: new node key, new
        # ledger, new lane). Old: the wallet kept accounts per peer id, so the drafter started afresh.
        key_file = tmp_path / "target" / "keys" / "operator.key"
        (tmp_path / "fresh").mkdir()
        same_operator = ("--operator-key", str(key_file), "--new-receipt-store", "--drafter-price", str(PRICE_WEI))
        again = start_target(tmp_path / "fresh", *chain_args, *DEADLINE, *same_operator)
        assert peer(again) != peer(target)
        drafter = start_drafter(tmp_path, again.lines["multiaddr"][0], "honest", "d", "--payout", dev_address(6))
        try:
            http = again.lines["http"][0]
            wait_for_drafters(http, 1)
            answer = complete(http, PROMPTS[0], seed=0, max_tokens=32, temperature=0.0)
            assert not answer["specmarket"]["credits"], answer["specmarket"]
            assert re.search(r"refusing a session from \S+: unpaid", drafter.log()), drafter.log()[-3000:]
        finally:
            drafter.stop()
            again.stop()


def test_an_operator_that_never_funds_the_lane_costs_a_checking_drafter_one_job_succeeds(tmp_path):
    """The attack on the exposure bound (issue 40 §2): an operator signs vouchers but never funds its
    drafters' lanes (Cheat.UNFUNDED), so no voucher can be redeemed. A drafter that checks the chain
    (--rpc) drafts its first job beside the check, then refuses the operator: every later job is
    decoded without it, and what it is owed is at most one job's pay. Old: the check ran in the
    session, which a short job ended before the check did (and a failed check only refused its own
    job), so every job was drafted unpaid."""
    max_tokens, jobs = 32, 4
    with deployed_chain(tmp_path / "deployments", escrow=True) as chain:
        chain_args = ("--chain", chain.rpc, "--deployments", str(chain.deployments), "--cheat", "unfunded-lanes")
        target = start_target(tmp_path, *chain_args, *DEADLINE, "--drafter-price", str(PRICE_WEI))
        checking = ("--payout", dev_address(6), "--rpc", chain.rpc)
        drafter = start_drafter(tmp_path, target.lines["multiaddr"][0], "honest", "d", *checking)
        try:
            http = target.lines["http"][0]
            wait_for_drafters(http, 1)
            credits = []
            for seed, prompt in enumerate(PROMPTS[:jobs]):
                answer = complete(http, prompt, seed=seed, max_tokens=max_tokens, temperature=0.0)
                credits.append(sum(answer["specmarket"]["credits"].values()))
            account = wait_for_verdict(tmp_path / "d", account_of(chain, tmp_path))
            refused = r"refusing a session from \S+: unpaid: lane \d+ of operator"
            deadline = time.monotonic() + SETTLE_TIMEOUT_S  # the refusal's line follows the verdict
            while not re.search(refused, log := drafter.log()) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert credits[0] > 0 and credits[1:] == [0] * (jobs - 1), (credits, log[-3000:])
            assert account.get("earned_wei", 0) <= PRICE_WEI * max_tokens, account  # ≤ one job's pay
            assert "short of" in account.get("uncovered", ""), account
            assert re.search(refused, log), log[-3000:]
            lane = EscrowClient(chain.client.w3, chain.deployment.escrow)
            assert lane.pool(Account.from_key(_operator_key(tmp_path)).address) > 0  # it could have paid
        finally:
            drafter.stop()
            target.stop()
