"""The drafter's wallet: which vouchers it keeps, when it notices it is underpaid, and that it never
loses a kept voucher. Vouchers are really signed (eth-account); no chain is needed here."""

from __future__ import annotations

import json
import logging

import pytest

from market.ledger import Ledger
from node.chain.deployment import dev_address, dev_key
from node.chain.vouchers import Voucher, escrow_domain, sign_voucher
from node.drafter.wallet import MAX_UNPAID_JOBS, Wallet, WalletError

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


def test_a_corrupt_wallet_is_an_error_not_an_empty_wallet(tmp_path):
    (tmp_path / "wallet.json").write_text(json.dumps({"format": 1, "accounts": {"t": {"voucher": "{"}}}))
    with pytest.raises(WalletError):
        Wallet.open(tmp_path, None)


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
