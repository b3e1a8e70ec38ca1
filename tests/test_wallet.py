"""The drafter's wallet: which vouchers it keeps, when it notices it is underpaid, and that it never
loses a kept voucher. Vouchers are really signed (eth-account); no chain is needed here."""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import pytest

from market.ledger import Ledger
from node.chain.deployment import dev_address, dev_key
from node.chain.vouchers import Voucher, escrow_domain, sign_voucher
from node.drafter import wallet as wallet_module
from node.drafter.wallet import (
    MAX_ACCOUNT_BYTES,
    MAX_ACCOUNTS,
    MAX_REASON_CHARS,
    MAX_UNPAID_JOBS,
    MAX_WALLET_BYTES,
    VERDICT_TTL_S,
    Account,
    Wallet,
    WalletError,
    WalletFull,
)

OPERATOR, DRAFTER, OTHER = 4, 6, 7
DOMAIN = escrow_domain(31337, "0x5FbDB2315678afecb367f032d93F642f64180aa3")
PRICE = 1000
TARGET = "12D3KooWTarget"


def voucher(
    wei: int, *, signer: int = OPERATOR, operator: int = OPERATOR, drafter: int = DRAFTER, domain=DOMAIN
) -> str:
    v = Voucher(dev_address(operator), dev_address(drafter), wei, 1_700_000_000)
    return sign_voucher(dev_key(signer), domain, v).dumps()


@pytest.fixture
def wallet(tmp_path) -> Wallet:
    return Wallet.open(tmp_path, dev_address(DRAFTER))


def test_an_honest_voucher_is_kept_and_survives_a_restart(wallet, tmp_path):
    kept = wallet.settle(TARGET, "j1", PRICE, 3, voucher(3 * PRICE))
    assert kept is not None and kept.voucher.cumulative_wei == 3 * PRICE
    again = Wallet.open(tmp_path, dev_address(DRAFTER))
    account = again.account(TARGET)
    assert (account.earned_wei, account.voucher_wei(), account.unpaid_jobs) == (3 * PRICE, 3 * PRICE, 0)
    assert again.vouchers()[TARGET] == kept
    assert not list(tmp_path.glob("*.tmp")), "a temporary wallet file was left behind"


def test_an_older_voucher_never_replaces_a_newer_one(wallet):
    wallet.settle(TARGET, "j2", PRICE, 5, voucher(8 * PRICE))  # job 2's settle came first
    assert wallet.settle(TARGET, "j1", PRICE, 3, voucher(3 * PRICE)) is None
    account = wallet.account(TARGET)
    assert (account.voucher_wei(), account.earned_wei, account.unpaid_jobs) == (8 * PRICE, 8 * PRICE, 0)


@pytest.mark.parametrize(
    "bad,why",
    [
        (lambda: voucher(3 * PRICE, signer=OTHER), "signed by"),  # forged: not the operator's signature
        (lambda: voucher(3 * PRICE, drafter=OTHER), "not this drafter"),  # another drafter's voucher
        (lambda: '{"format": 1, "cumulative_wei": "3"}', "malformed"),
        (lambda: "x" * 5000, "at most"),
    ],
)
def test_an_invalid_voucher_is_refused_and_counts_as_unpaid(wallet, caplog, bad, why):
    with caplog.at_level(logging.WARNING):
        assert wallet.settle(TARGET, "j1", PRICE, 3, bad()) is None
    assert why in caplog.text
    account = wallet.account(TARGET)
    assert (account.voucher, account.unpaid_jobs, account.short_wei()) == ("", 1, 3 * PRICE)


def test_a_voucher_from_another_operator_or_escrow_is_refused(wallet, caplog):
    wallet.settle(TARGET, "j1", PRICE, 3, voucher(3 * PRICE))
    other_escrow = escrow_domain(31337, "0x" + "11" * 20)
    with caplog.at_level(logging.WARNING):
        assert wallet.settle(TARGET, "j2", PRICE, 1, voucher(4 * PRICE, signer=OTHER, operator=OTHER)) is None
        assert wallet.settle(TARGET, "j3", PRICE, 1, voucher(5 * PRICE, domain=other_escrow)) is None
    assert "not by this target's operator" in caplog.text and "for escrow" in caplog.text
    assert wallet.account(TARGET).voucher_wei() == 3 * PRICE


def test_an_underpaying_operator_is_refused_after_more_than_one_short_job(wallet, caplog):
    with caplog.at_level(logging.WARNING):
        for job in range(MAX_UNPAID_JOBS + 1):
            assert wallet.refusal(TARGET) is None
            earned = (job + 1) * 4 * PRICE
            wallet.settle(TARGET, f"j{job}", PRICE, 4, voucher(earned // 2))  # half of what was earned
    assert caplog.text.count("short") == MAX_UNPAID_JOBS + 1  # one line per short job
    refusal = wallet.refusal(TARGET)
    assert refusal is not None and refusal.startswith("unpaid")
    wallet.settle(TARGET, "late", PRICE, 0, voucher(wallet.account(TARGET).earned_wei))  # it pays up in full
    assert wallet.refusal(TARGET) is None


def test_one_late_voucher_is_tolerated(wallet):
    """A job whose settle never came (the last advance's count, no voucher) leaves the drafter short
    for one job; the next voucher covers both, and drafting never stopped."""
    wallet.settle(TARGET, "j1", PRICE, 3, "")
    assert wallet.account(TARGET).unpaid_jobs == 1 and wallet.refusal(TARGET) is None
    wallet.settle(TARGET, "j2", PRICE, 2, voucher(5 * PRICE))
    assert wallet.account(TARGET).unpaid_jobs == 0


def test_an_escrow_that_cannot_cover_is_refused_until_it_can(wallet):
    wallet.mark_cover(TARGET, "escrow holds 0 ETH for 0.001 ETH unredeemed")
    assert wallet.refusal(TARGET) == "unpaid: escrow holds 0 ETH for 0.001 ETH unredeemed"
    wallet.mark_cover(TARGET, "")
    assert wallet.refusal(TARGET) is None


def test_a_corrupt_wallet_is_set_aside_and_its_valid_vouchers_recovered(tmp_path, caplog):
    """Never an empty wallet in silence, never a lost voucher: the unreadable file is kept under another
    name, the accounts that still read are recovered, and the error is logged."""
    good = {"earned_wei": 3 * PRICE, "jobs": 1, "voucher": voucher(3 * PRICE)}
    text = json.dumps({"format": 1, "accounts": {"bad": {"voucher": "{"}, TARGET: good}})
    (tmp_path / "wallet.json").write_text(text)
    with caplog.at_level(logging.ERROR):
        wallet = Wallet.open(tmp_path, dev_address(DRAFTER))
    assert list(wallet.accounts) == [TARGET] and wallet.account(TARGET).voucher_wei() == 3 * PRICE
    (aside,) = tmp_path.glob("wallet.json.unreadable-*")
    assert aside.read_text() == text
    assert "cannot read the wallet" in caplog.text and "1 accounts (1 with a voucher) were recovered" in caplog.text
    assert Wallet.open(tmp_path, None).accounts == wallet.accounts  # the rewritten wallet reads


def test_a_wallet_past_its_size_bound_still_opens_with_its_vouchers(tmp_path):
    """The old failure (issue 40 §1): a wallet that grew past MAX_WALLET_BYTES failed the next start,
    and recovering meant losing the real vouchers. Now the file is set aside and the vouchers kept."""
    wallet = Wallet.open(tmp_path, dev_address(DRAFTER))
    wallet.settle(TARGET, "j1", PRICE, 3, voucher(3 * PRICE))
    data = json.loads((tmp_path / "wallet.json").read_text())
    junk = {f"peer-{i}": {"jobs": 1, "uncovered": "x" * 200} for i in range(MAX_WALLET_BYTES // 200)}
    data["accounts"] = {**junk, **data["accounts"]}  # the voucher last, behind more than MAX_ACCOUNTS others
    (tmp_path / "wallet.json").write_text(json.dumps(data))
    assert (tmp_path / "wallet.json").stat().st_size > MAX_WALLET_BYTES
    again = Wallet.open(tmp_path, dev_address(DRAFTER))
    assert again.account(TARGET).voucher_wei() == 3 * PRICE
    assert len(again.accounts) <= MAX_ACCOUNTS and (tmp_path / "wallet.json").stat().st_size < MAX_WALLET_BYTES


def test_a_maximal_account_fits_so_a_full_wallet_stays_readable():
    """The bound's arithmetic: an account as large as the wallet keeps (a voucher for 2**256 - 1 wei,
    a reason of MAX_REASON_CHARS, every count huge) fits MAX_ACCOUNT_BYTES, and MAX_ACCOUNTS of them fit
    MAX_WALLET_BYTES with the file's indentation. (Old: 4096 accounts of ~1 KB passed 4 MiB.)"""
    big = (1 << 256) - 1
    account = Account(dev_address(OPERATOR), big, big, big, big, voucher(big), "x" * MAX_REASON_CHARS, 1e300)
    assert len(json.dumps(dataclasses.asdict(account))) <= MAX_ACCOUNT_BYTES
    indented = len(json.dumps({"t" * 64: dataclasses.asdict(account)}, indent=1)) + 8
    assert MAX_ACCOUNTS * indented < MAX_WALLET_BYTES


def test_targets_each_with_a_throwaway_voucher_fill_the_wallet_and_then_are_refused(tmp_path, monkeypatch):
    """The attack: every new peer id settles a valid voucher signed by a fresh key. Accounts with a
    voucher are never evicted, so the wallet refuses a newcomer once full (WalletFull), keeps what it
    holds, and stays readable. (MAX_ACCOUNTS lowered to 4 to run it in a moment.)"""
    monkeypatch.setattr(wallet_module, "MAX_ACCOUNTS", 4)
    wallet = Wallet.open(tmp_path, dev_address(DRAFTER))
    wallet.settle("voucherless", "j", PRICE, 0, "")  # evicted first
    for i in range(4):
        signer = 10 + i
        wallet.settle(f"sybil-{i}", "j", PRICE, 1, voucher(PRICE, signer=signer, operator=signer))
    assert "voucherless" not in wallet.accounts and len(wallet.accounts) == 4
    with pytest.raises(WalletFull, match="each with a voucher"):
        wallet.opened("sybil-4", PRICE)
    assert Wallet.open(tmp_path, dev_address(DRAFTER)).vouchers() == wallet.vouchers()


def test_a_refusal_lapses_and_is_judged_again(wallet):
    wallet.mark_cover(TARGET, "escrow holds 0 ETH for 0.001 ETH unredeemed")
    judged = wallet.account(TARGET).judged_at
    assert wallet.refusal(TARGET, now=judged + VERDICT_TTL_S - 1) is not None
    assert wallet.lapsed(TARGET, now=judged + VERDICT_TTL_S) and wallet.refusal(TARGET, judged + VERDICT_TTL_S) is None
    wallet.mark_cover(TARGET, "escrow holds 0 ETH for 0.002 ETH unredeemed")  # judged again: refused anew
    assert wallet.refusal(TARGET) is not None and not wallet.lapsed(TARGET)


def test_an_unpaid_verdict_lapses_for_one_more_job(wallet):
    for job in range(MAX_UNPAID_JOBS + 1):
        wallet.settle(TARGET, f"j{job}", PRICE, 4, "")  # never paid
    judged = wallet.account(TARGET).judged_at
    later = judged + VERDICT_TTL_S
    assert wallet.refusal(TARGET) is not None and wallet.refusal(TARGET, now=later) is None
    wallet.settle(TARGET, "one-more", PRICE, 4, "")  # still unpaid: refused again from now
    assert wallet.refusal(TARGET) is not None and wallet.account(TARGET).judged_at > judged


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
    wallet.settle(TARGET, "j1", PRICE, 3, voucher(3 * PRICE))
    assert synced == [str(tmp_path / "wallet.json.tmp"), str(tmp_path)]


def test_the_operators_ledger_signs_the_voucher_the_wallet_keeps(tmp_path, wallet):
    """The target's side and the drafter's side of one job agree: credit_and_pay's voucher pays
    price x accepted, and the wallet keeps it without a shortfall."""
    from market.ledger import Pay

    def sign(drafter: str, wei: int) -> str:
        return sign_voucher(dev_key(OPERATOR), DOMAIN, Voucher(dev_address(OPERATOR), drafter, wei, 1)).dumps()

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        pay = Pay("31337:escrow", PRICE, {"peer": dev_address(DRAFTER)}, sign)
        for job, accepted in enumerate((3, 0, 5)):
            vouchers = ledger.credit_and_pay(f"job{job}", {"peer": (accepted, 6)}, pay)
            assert vouchers is not None
            wallet.settle(TARGET, f"job{job}", PRICE, accepted, vouchers.get("peer", ""))
        assert ledger.credit_and_pay("job2", {"peer": (5, 6)}, pay) is None  # a repeat signs nothing
        assert ledger.earnings() == {"peer": 8 * PRICE}
    account = wallet.account(TARGET)
    assert (account.earned_wei, account.voucher_wei(), account.unpaid_jobs) == (8 * PRICE, 8 * PRICE, 0)


def test_a_failing_signer_rolls_the_whole_job_back(tmp_path):
    from market.ledger import Pay

    def broken(drafter: str, wei: int) -> str:
        raise RuntimeError("the key is gone")

    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        with pytest.raises(RuntimeError):
            ledger.credit_and_pay("job", {"peer": (3, 4)}, Pay("e", PRICE, {"peer": dev_address(DRAFTER)}, broken))
        assert not ledger.has_job("job") and ledger.totals() == {} and ledger.earnings() == {}
