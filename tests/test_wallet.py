"""The drafter's wallet: which vouchers it keeps, when it notices it is underpaid, and that it never
loses a kept voucher. Accounts are the operator's (chain id, escrow, operator address), whatever peer
id or ledger its jobs come from; each lane keeps its own newest voucher. Vouchers are really signed
(eth-account); no chain is needed here."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest

from market.ledger import Ledger
from node.chain.deployment import dev_address, dev_key
from node.chain.receipts import MAX_U64
from node.chain.vouchers import Voucher, escrow_domain, sign_voucher
from node.drafter import wallet as wallet_module
from node.drafter.terms import Terms
from node.drafter.wallet import (
    MAX_ACCOUNT_BYTES,
    MAX_ACCOUNTS,
    MAX_LANES,
    MAX_REASON_CHARS,
    MAX_UNPAID_JOBS,
    MAX_WALLET_BYTES,
    VERDICT_TTL_S,
    WALLET_FORMAT,
    Account,
    Wallet,
    WalletError,
    WalletFull,
)
from p2p.messages import Open

OPERATOR, DRAFTER, OTHER = 4, 6, 7
CHAIN = 31337
ESCROW = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
DOMAIN = escrow_domain(CHAIN, ESCROW)
PRICE = 1000
LANE = 1


def terms(lane: int = LANE, *, operator: int = OPERATOR, price: int = PRICE) -> Terms:
    """What a paying open of ``operator``'s, from a ledger on ``lane``, promises."""
    return Terms(CHAIN, ESCROW, dev_address(operator), lane, price, 100 * price)


def voucher(
    wei: int,
    *,
    lane: int = LANE,
    signer: int = OPERATOR,
    operator: int = OPERATOR,
    drafter: int = DRAFTER,
    domain=DOMAIN,
    issued_at: int = 1_700_000_000,
) -> str:
    v = Voucher(dev_address(operator), dev_address(drafter), lane, wei, issued_at)
    return sign_voucher(dev_key(signer), domain, v).dumps()


@pytest.fixture
def wallet(tmp_path) -> Wallet:
    return Wallet.open(tmp_path, dev_address(DRAFTER))


def test_an_honest_voucher_is_kept_and_survives_a_restart(wallet, tmp_path):
    kept = wallet.settle(terms(), "j1", 3, voucher(3 * PRICE))
    assert kept is not None and kept.voucher.cumulative_wei == 3 * PRICE
    again = Wallet.open(tmp_path, dev_address(DRAFTER))
    account = again.account(terms().account)
    assert (account.earned_wei, account.voucher_wei(), account.unpaid_jobs) == (3 * PRICE, 3 * PRICE, 0)
    assert (account.chain_id, account.escrow, account.operator) == (CHAIN, ESCROW, dev_address(OPERATOR))
    assert again.vouchers() == {f"{terms().account}:{LANE}": kept} and again.lane_voucher(terms()) == kept
    assert again.lane_voucher(terms(LANE + 1)) is None
    assert not list(tmp_path.glob("*.tmp")), "a temporary wallet file was left behind"


def test_an_older_voucher_never_replaces_a_newer_one(wallet):
    wallet.settle(terms(), "j2", 5, voucher(8 * PRICE))  # job 2's settle came first
    assert wallet.settle(terms(), "j1", 3, voucher(3 * PRICE)) is None
    assert wallet.settle(terms(), "j1-again", 0, voucher(8 * PRICE)) is None  # equal: not kept either
    account = wallet.account(terms().account)
    assert (account.voucher_wei(), account.earned_wei, account.unpaid_jobs) == (8 * PRICE, 8 * PRICE, 0)


@pytest.mark.parametrize(
    "bad,why",
    [
        (lambda: voucher(3 * PRICE, signer=OTHER), "signed by"),  # forged: not the operator's signature
        (lambda: voucher(3 * PRICE, drafter=OTHER), "not this drafter"),  # another drafter's voucher
        (lambda: voucher(3 * PRICE, lane=LANE + 1), "not this job's lane"),  # another lane's
        (lambda: '{"format": 2, "cumulative_wei": "3"}', "malformed"),
        (lambda: "x" * 5000, "at most"),
    ],
)
def test_an_invalid_voucher_is_refused_and_counts_as_unpaid(wallet, caplog, bad, why):
    with caplog.at_level(logging.WARNING):
        assert wallet.settle(terms(), "j1", 3, bad()) is None
    assert why in caplog.text
    account = wallet.account(terms().account)
    assert (account.lanes, account.unpaid_jobs, account.short_wei()) == ({}, 1, 3 * PRICE)


def test_a_voucher_from_another_operator_or_escrow_is_refused(wallet, caplog):
    wallet.settle(terms(), "j1", 3, voucher(3 * PRICE))
    other_escrow = escrow_domain(CHAIN, "0x" + "11" * 20)
    other_chain = escrow_domain(CHAIN + 1, ESCROW)
    with caplog.at_level(logging.WARNING):
        assert wallet.settle(terms(), "j2", 1, voucher(4 * PRICE, signer=OTHER, operator=OTHER)) is None
        assert wallet.settle(terms(), "j3", 1, voucher(5 * PRICE, domain=other_escrow)) is None
        assert wallet.settle(terms(), "j4", 1, voucher(6 * PRICE, domain=other_chain)) is None
    assert "not by this job's operator" in caplog.text and caplog.text.count("for escrow") == 2
    assert wallet.account(terms().account).voucher_wei() == 3 * PRICE


def test_an_underpaying_operator_is_refused_after_more_than_one_short_job(wallet, caplog):
    key = terms().account
    with caplog.at_level(logging.WARNING):
        for job in range(MAX_UNPAID_JOBS + 1):
            assert wallet.refusal(key) is None
            earned = (job + 1) * 4 * PRICE
            wallet.settle(terms(), f"j{job}", 4, voucher(earned // 2))  # half of what was earned
    assert caplog.text.count("short") == MAX_UNPAID_JOBS + 1  # one line per short job
    refusal = wallet.refusal(key)
    assert refusal is not None and refusal.startswith("unpaid")
    wallet.settle(terms(), "late", 0, voucher(wallet.account(key).earned_wei))  # it pays up in full
    assert wallet.refusal(key) is None


def test_fresh_peer_identity_does_not_reset_the_verdict(wallet):
    """The attack (issue 40 §2): an operator underpays until it is refused, then restarts its target
    under a fresh peer identity (and a fresh ledger: a new lane) and opens again. The old wallet keyed
    accounts by the target's peer id, so the fresh identity had a clean account and was served. Now
    the account is the operator's, read from what the open promises: the peer id takes no part."""

    def open_from(lane: int) -> Open:
        return Open(
            "job", (1, 2), 1.0, 0, 1.0, 7, 4, 1,
            price_wei=PRICE, chain_id=CHAIN, escrow=ESCROW, operator=dev_address(OPERATOR), lane=lane,
            max_pay_wei=100 * PRICE,
        )  # fmt: skip

    opens = {"12D3KooWFirstIdentity": open_from(1), "12D3KooWFreshIdentity": open_from(2)}  # peer id -> its open
    first, fresh = (Terms.of(msg) for msg in opens.values())
    assert first is not None and fresh is not None
    for job in range(MAX_UNPAID_JOBS + 1):
        wallet.opened(first)
        wallet.settle(first, f"j{job}", 4, voucher(PRICE, lane=1))  # one token's pay for four
    assert wallet.refusal(first.account) is not None
    assert fresh.account == first.account  # old: two peer ids, two accounts; now: one operator, one account
    assert not any(peer in fresh.account for peer in opens)
    refusal = wallet.refusal(fresh.account)
    assert refusal is not None and refusal.startswith("unpaid")
    assert list(wallet.accounts) == [first.account]


def test_two_ledgers_of_one_operator_are_summed(wallet, caplog):
    """Two replicas of one operator, each with a ledger of its own (a lane each), pay their own
    cumulative vouchers: the account sums what both owe and what both vouchers pay. A smaller voucher
    on one lane after a larger one on the other is new (old: it was taken for an older voucher and
    dropped, leaving the drafter short), and neither lane's voucher replaces the other's."""
    a, b = terms(11), terms(22)
    wallet.opened(a)
    wallet.opened(b)
    assert wallet.settle(b, "b1", 5, voucher(5 * PRICE, lane=22)) is not None
    assert wallet.settle(a, "a1", 3, voucher(3 * PRICE, lane=11)) is not None
    account = wallet.account(a.account)
    assert a.account == b.account and list(wallet.accounts) == [a.account]
    assert (account.earned_wei, account.voucher_wei(), account.short_wei(), account.unpaid_jobs) == (
        8 * PRICE, 8 * PRICE, 0, 0,
    )  # fmt: skip
    assert wallet.settle(a, "a2", 1, voucher(4 * PRICE, lane=11)) is not None
    assert wallet.lane_voucher(a).voucher.cumulative_wei == 4 * PRICE
    assert wallet.lane_voucher(b).voucher.cumulative_wei == 5 * PRICE  # lane A's voucher left lane B's alone
    assert {k: v.voucher.cumulative_wei for k, v in wallet.vouchers().items()} == {
        f"{a.account}:11": 4 * PRICE,
        f"{a.account}:22": 5 * PRICE,
    }
    with caplog.at_level(logging.WARNING):  # replica A's open, a voucher naming lane B: refused
        assert wallet.settle(a, "a3", 1, voucher(7 * PRICE, lane=22)) is None
    assert "it is for lane 22, not this job's lane 11" in caplog.text
    account = wallet.account(a.account)
    assert (account.voucher_wei(), account.short_wei(), account.unpaid_jobs) == (9 * PRICE, PRICE, 1)


def test_a_new_lane_past_max_lanes_is_refused_and_no_voucher_is_dropped(wallet, tmp_path, caplog):
    for lane in range(1, MAX_LANES + 1):
        wallet.opened(terms(lane))
        assert wallet.settle(terms(lane), f"j{lane}", 1, voucher(PRICE, lane=lane)) is not None
    kept = wallet.vouchers()
    assert len(kept) == MAX_LANES
    with pytest.raises(WalletFull, match=f"{MAX_LANES} lanes"):
        wallet.opened(terms(MAX_LANES + 1))
    with caplog.at_level(logging.WARNING):  # a settle without its open: the voucher is refused, none dropped
        assert wallet.settle(terms(MAX_LANES + 1), "j-new", 1, voucher(PRICE, lane=MAX_LANES + 1)) is None
    assert f"{MAX_LANES} lanes" in caplog.text
    wallet.opened(terms(3))  # a lane it already keeps opens as before
    assert wallet.settle(terms(3), "j3b", 1, voucher(2 * PRICE, lane=3)) is not None
    again = Wallet.open(tmp_path, dev_address(DRAFTER)).vouchers()
    assert set(again) == set(kept) and again[f"{terms().account}:3"].voucher.cumulative_wei == 2 * PRICE


def test_a_format1_wallet_is_set_aside_unread(tmp_path, caplog):
    """A wallet of the per-peer-id format holds vouchers for the single-pool escrow, which a lane
    escrow cannot redeem: it is renamed (never deleted), and the drafter starts an empty wallet."""
    old = {"operator": dev_address(OPERATOR), "earned_wei": 3 * PRICE, "jobs": 1, "voucher": "{}"}
    text = json.dumps({"format": 1, "accounts": {"12D3KooWTarget": old}})
    (tmp_path / "wallet.json").write_text(text)
    with caplog.at_level(logging.ERROR):
        wallet = Wallet.open(tmp_path, dev_address(DRAFTER))
    assert wallet.accounts == {}
    (aside,) = tmp_path.glob("wallet.json.format1-*")
    assert aside.read_text() == text and not list(tmp_path.glob("*.unreadable-*"))
    assert json.loads((tmp_path / "wallet.json").read_text()) == {"format": WALLET_FORMAT, "accounts": {}}
    (record,) = caplog.records
    assert "format-1" in record.message and "old" in record.message and str(aside) in record.message


def test_one_late_voucher_is_tolerated(wallet):
    """A job whose settle never came (the last advance's count, no voucher) leaves the drafter short
    for one job; the next voucher covers both, and drafting never stopped."""
    key = terms().account
    wallet.settle(terms(), "j1", 3, "")
    assert wallet.account(key).unpaid_jobs == 1 and wallet.refusal(key) is None
    wallet.settle(terms(), "j2", 2, voucher(5 * PRICE))
    assert wallet.account(key).unpaid_jobs == 0


def test_an_escrow_that_cannot_cover_is_refused_until_it_can(wallet):
    key = terms().account
    wallet.mark_cover(key, "escrow holds 0 ETH for 0.001 ETH unredeemed")
    assert wallet.refusal(key) == "unpaid: escrow holds 0 ETH for 0.001 ETH unredeemed"
    assert wallet.account(key).operator == dev_address(OPERATOR)
    wallet.mark_cover(key, "")
    assert wallet.refusal(key) is None


def test_a_corrupt_wallet_is_set_aside_and_its_valid_vouchers_recovered(tmp_path, caplog):
    """Never an empty wallet in silence, never a lost voucher: the unreadable file is kept under another
    name, the accounts that still read are recovered, and the error is logged."""
    key = terms().account
    good = Account(CHAIN, ESCROW, dev_address(OPERATOR), PRICE, 3 * PRICE, 1, 0, {str(LANE): voucher(3 * PRICE)})
    misfiled = {"12D3KooWTarget": dataclasses.asdict(good)}  # not its operator's key
    accounts = {"bad": {"lanes": {"1": "{"}}, **misfiled, key: dataclasses.asdict(good)}
    text = json.dumps({"format": WALLET_FORMAT, "accounts": accounts})
    (tmp_path / "wallet.json").write_text(text)
    with caplog.at_level(logging.ERROR):
        wallet = Wallet.open(tmp_path, dev_address(DRAFTER))
    assert list(wallet.accounts) == [key] and wallet.account(key).voucher_wei() == 3 * PRICE
    (aside,) = tmp_path.glob("wallet.json.unreadable-*")
    assert aside.read_text() == text
    assert "cannot read the wallet" in caplog.text and "1 accounts (1 with a voucher) were recovered" in caplog.text
    assert Wallet.open(tmp_path, None).accounts == wallet.accounts  # the rewritten wallet reads


def test_a_wallet_past_its_size_bound_still_opens_with_its_vouchers(tmp_path):
    """The old failure (issue 40 §1): a wallet that grew past MAX_WALLET_BYTES failed the next start,
    and recovering meant losing the real vouchers. Now the file is set aside and the vouchers kept."""
    from node.drafter.terms import account_key

    wallet = Wallet.open(tmp_path, dev_address(DRAFTER))
    wallet.settle(terms(), "j1", 3, voucher(3 * PRICE))
    data = json.loads((tmp_path / "wallet.json").read_text())
    junk = {}  # valid accounts without a voucher, more than MAX_ACCOUNTS of them
    for i in range(MAX_WALLET_BYTES // 4000):
        key = account_key(CHAIN, ESCROW, f"0x{i + 1:040x}")
        junk[key] = dataclasses.asdict(Account(CHAIN, ESCROW, key.rsplit(":", 1)[1], jobs=1, uncovered="x" * 4000))
    data["accounts"] = {**junk, **data["accounts"]}  # the voucher last, behind more than MAX_ACCOUNTS others
    (tmp_path / "wallet.json").write_text(json.dumps(data))
    assert (tmp_path / "wallet.json").stat().st_size > MAX_WALLET_BYTES
    again = Wallet.open(tmp_path, dev_address(DRAFTER))
    assert again.account(terms().account).voucher_wei() == 3 * PRICE
    assert len(again.accounts) == MAX_ACCOUNTS and (tmp_path / "wallet.json").stat().st_size < MAX_WALLET_BYTES


def test_a_maximal_account_fits_so_a_full_wallet_stays_readable():
    """The bound's arithmetic: an account as large as the wallet keeps (MAX_LANES lanes, each with the
    largest voucher: 2**256 - 1 wei, every uint64 at its maximum; a reason of MAX_REASON_CHARS; every
    count huge) fits MAX_ACCOUNT_BYTES, and MAX_ACCOUNTS of them fit MAX_WALLET_BYTES as the wallet
    writes them (indented). (Old: 4096 accounts of ~1 KB passed 4 MiB.)"""
    big, domain = (1 << 256) - 1, escrow_domain(MAX_U64, ESCROW)
    lanes = {
        str(MAX_U64 - i): voucher(big, lane=MAX_U64 - i, domain=domain, issued_at=MAX_U64) for i in range(MAX_LANES)
    }
    account = Account(MAX_U64, ESCROW, dev_address(OPERATOR), big, big, big, big, lanes, "x" * MAX_REASON_CHARS, 1e300)
    key = Terms(MAX_U64, ESCROW, dev_address(OPERATOR), 0, 1, 1).account
    assert wallet_module._account(key, dataclasses.asdict(account)) == account  # it reads back as it is
    assert len(json.dumps(dataclasses.asdict(account))) <= MAX_ACCOUNT_BYTES
    one = len(json.dumps({"format": WALLET_FORMAT, "accounts": {key: dataclasses.asdict(account)}}, indent=1))
    assert MAX_ACCOUNTS * one < MAX_WALLET_BYTES


def test_operators_each_with_a_throwaway_voucher_fill_the_wallet_and_then_are_refused(tmp_path, monkeypatch):
    """The attack: every new operator key settles a valid voucher signed by itself. Accounts with a
    voucher are never evicted, so the wallet refuses a newcomer once full (WalletFull), keeps what it
    holds, and stays readable. (MAX_ACCOUNTS lowered to 4 to run it in a moment.)"""
    monkeypatch.setattr(wallet_module, "MAX_ACCOUNTS", 4)
    wallet = Wallet.open(tmp_path, dev_address(DRAFTER))
    voucherless = terms(operator=OTHER)
    wallet.settle(voucherless, "j", 0, "")  # evicted first
    for i in range(4):
        signer = 10 + i
        wallet.settle(terms(operator=signer), "j", 1, voucher(PRICE, signer=signer, operator=signer))
    assert voucherless.account not in wallet.accounts and len(wallet.accounts) == 4
    with pytest.raises(WalletFull, match="each with a voucher"):
        wallet.opened(terms(operator=14))
    assert Wallet.open(tmp_path, dev_address(DRAFTER)).vouchers() == wallet.vouchers()


def test_a_refusal_lapses_and_is_judged_again(wallet):
    key = terms().account
    wallet.mark_cover(key, "escrow holds 0 ETH for 0.001 ETH unredeemed")
    judged = wallet.account(key).judged_at
    assert wallet.refusal(key, now=judged + VERDICT_TTL_S - 1) is not None
    assert wallet.lapsed(key, now=judged + VERDICT_TTL_S) and wallet.refusal(key, judged + VERDICT_TTL_S) is None
    wallet.mark_cover(key, "escrow holds 0 ETH for 0.002 ETH unredeemed")  # judged again: refused anew
    assert wallet.refusal(key) is not None and not wallet.lapsed(key)


def test_an_unpaid_verdict_lapses_for_one_more_job(wallet):
    key = terms().account
    for job in range(MAX_UNPAID_JOBS + 1):
        wallet.settle(terms(), f"j{job}", 4, "")  # never paid
    judged = wallet.account(key).judged_at
    later = judged + VERDICT_TTL_S
    assert wallet.refusal(key) is not None and wallet.refusal(key, now=later) is None
    wallet.settle(terms(), "one-more", 4, "")  # still unpaid: refused again from now
    assert wallet.refusal(key) is not None and wallet.account(key).judged_at > judged


def test_one_drafter_at_a_time_holds_a_wallet(tmp_path):
    first = Wallet.open(tmp_path, dev_address(DRAFTER), lock=True)
    with pytest.raises(WalletError, match="another drafter is running on"):
        Wallet.open(tmp_path, dev_address(DRAFTER), lock=True)
    assert Wallet.open(tmp_path, None).accounts == {}  # reading (`drafter redeem`) needs no lock
    first.close()
    Wallet.open(tmp_path, dev_address(DRAFTER), lock=True).close()


def test_the_directory_is_synced_after_the_rename(wallet, tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    wallet.settle(terms(), "j1", 3, voucher(3 * PRICE))
    assert synced == [str(tmp_path / "wallet.json.tmp"), str(tmp_path)]


def test_the_operators_ledger_signs_the_voucher_the_wallet_keeps(tmp_path, wallet):
    """The target's side and the drafter's side of one job agree: credit_and_pay's voucher pays
    price x accepted on the ledger's lane, and the wallet keeps it without a shortfall."""
    from market.ledger import Pay

    def sign(drafter: str, lane: int, wei: int) -> str:
        v = Voucher(dev_address(OPERATOR), drafter, lane, wei, 1)
        return sign_voucher(dev_key(OPERATOR), DOMAIN, v).dumps()

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        pay = Pay(f"{CHAIN}:{ESCROW}", PRICE, {"peer": dev_address(DRAFTER)}, sign)
        for job, accepted in enumerate((3, 0, 5)):
            vouchers = ledger.credit_and_pay(f"job{job}", {"peer": (accepted, 6)}, pay)
            assert vouchers is not None
            wallet.settle(terms(ledger.lane), f"job{job}", accepted, vouchers.get("peer", ""))
        assert ledger.credit_and_pay("job2", {"peer": (5, 6)}, pay) is None  # a repeat signs nothing
        assert ledger.earnings() == {"peer": 8 * PRICE}
        assert wallet.lane_voucher(terms(ledger.lane)).voucher.lane == ledger.lane
    account = wallet.account(terms().account)
    assert (account.earned_wei, account.voucher_wei(), account.unpaid_jobs) == (8 * PRICE, 8 * PRICE, 0)


def test_a_failing_signer_rolls_the_whole_job_back(tmp_path):
    from market.ledger import Pay

    def broken(drafter: str, lane: int, wei: int) -> str:
        raise RuntimeError("the key is gone")

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(RuntimeError):
            ledger.credit_and_pay("job", {"peer": (3, 4)}, Pay("e", PRICE, {"peer": dev_address(DRAFTER)}, broken))
        assert not ledger.has_job("job") and ledger.totals() == {} and ledger.earnings() == {}
