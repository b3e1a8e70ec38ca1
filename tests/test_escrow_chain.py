"""DrafterEscrow on a real anvil, driven from Python: the vouchers node.chain.vouchers signs are the
ones the contract pays, and every attack on a voucher reverts with the contract's own error.

The contract's own Foundry suite covers the same rules exhaustively (contracts/test/DrafterEscrow*);
this file checks that the Python side (hashing, signing, the client) agrees with it byte for byte.
"""

from __future__ import annotations

import pytest
from chainutil import deployed_chain, warp
from eth_account import Account

from node.chain.client import ChainRevert
from node.chain.deployment import DEFAULT_WITHDRAWAL_DELAY_S, DEV_DEPLOYER, ETHER, dev_key
from node.chain.escrow import EscrowClient
from node.chain.receipts import SECP256K1_N
from node.chain.vouchers import SignedVoucher, Voucher, VoucherError, escrow_domain, sign_voucher

DEPOSIT = ETHER // 10


@pytest.fixture(scope="module")
def escrow_chain(tmp_path_factory):
    with deployed_chain(tmp_path_factory.mktemp("escrow"), escrow=True) as chain:
        yield chain, EscrowClient(chain.client.w3, chain.deployment.escrow)


def funded(chain, eth: int = 1) -> bytes:
    """A fresh account with ``eth`` ETH from anvil's account 0."""
    from node.chain.contract import transfer

    key = bytes(Account.create().key)
    transfer(chain.client.w3, dev_key(DEV_DEPLOYER), Account.from_key(key).address, eth * ETHER)
    return key


def address(key: bytes) -> str:
    return Account.from_key(key).address


def voucher(escrow: EscrowClient, operator_key: bytes, drafter: str, wei: int, domain=None) -> SignedVoucher:
    v = Voucher(address(operator_key), drafter, wei, 1_700_000_000)
    return sign_voucher(operator_key, domain or escrow.domain, v)


def balance(escrow: EscrowClient, who: str) -> int:
    return escrow.w3.eth.get_balance(who)


def gas_cost(escrow: EscrowClient, tx_hash: str) -> int:
    receipt = escrow.w3.eth.get_transaction_receipt(tx_hash)
    return receipt["gasUsed"] * receipt["effectiveGasPrice"]


def test_python_digest_equals_the_contracts(escrow_chain):
    chain, escrow = escrow_chain
    op = funded(chain)
    signed = voucher(escrow, op, address(funded(chain)), 12345)
    from eth_account.messages import _hash_eip191_message

    from node.chain.receipts import typed_signable
    from node.chain.vouchers import VOUCHER_TYPES

    ours = _hash_eip191_message(typed_signable(escrow.domain, VOUCHER_TYPES, signed.voucher.message()))
    assert bytes(escrow.call("voucherDigest", signed.voucher.as_tuple())) == bytes(ours)


def test_redeem_pays_the_increment_and_a_replay_reverts(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.deposit(op, DEPOSIT)
    first = voucher(escrow, op, address(drafter), 3000)
    before = balance(escrow, address(drafter))
    done = escrow.redeem(drafter, first)
    assert (done.amount, done.short) == (3000, 0)
    assert balance(escrow, address(drafter)) == before + 3000 - gas_cost(escrow, done.tx.tx_hash)
    second = voucher(escrow, op, address(drafter), 5000)
    assert escrow.redeem(drafter, second).amount == 2000  # cumulative: only the difference
    assert escrow.paid(address(op), address(drafter)) == 5000
    for old in (first, second):  # an older or equal voucher pays nothing
        with pytest.raises(ChainRevert) as err:
            escrow.redeem(drafter, old)
        assert err.value.name == "VoucherNotNewer"
        assert err.value.values == {"cumulativeWei": old.voucher.cumulative_wei, "paid": 5000}
    assert escrow.state(address(op)).balance == DEPOSIT - 5000


def test_a_forged_voucher_reverts_bad_signer(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.deposit(op, DEPOSIT)
    forged = sign_voucher(drafter, escrow.domain, Voucher(address(op), address(drafter), 10**15, 0))  # self-signed
    with pytest.raises(VoucherError):
        forged.check()
    with pytest.raises(ChainRevert) as err:
        escrow.redeem(drafter, forged)
    assert err.value.name == "BadSigner" and err.value.values["recovered"] == address(drafter)


def test_another_drafters_voucher_cannot_be_redeemed(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter, thief = funded(chain), funded(chain), funded(chain)
    escrow.deposit(op, DEPOSIT)
    signed = voucher(escrow, op, address(drafter), 4000)
    with pytest.raises(ChainRevert) as err:
        escrow.redeem(thief, signed)
    assert err.value.name == "NotVoucherDrafter"
    assert err.value.values == {"caller": address(thief), "drafter": address(drafter)}
    assert escrow.paid(address(op), address(drafter)) == 0


def test_a_voucher_for_another_chain_or_escrow_is_refused(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.deposit(op, DEPOSIT)
    elsewhere = [escrow_domain(1, escrow.address), escrow_domain(escrow.domain.chain_id, chain.deployment.address)]
    for domain in elsewhere:
        signed = voucher(escrow, op, address(drafter), 4000, domain)
        with pytest.raises(ChainRevert) as err:  # sent as if it were for this escrow: the digest differs
            escrow.redeem(drafter, SignedVoucher(escrow.domain, signed.voucher, signed.signature))
        assert err.value.name == "BadSigner"


def test_a_high_s_twin_is_refused_in_python_and_on_chain(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.deposit(op, DEPOSIT)
    signed = voucher(escrow, op, address(drafter), 4000)
    r, s, v = signed.signature[:32], int.from_bytes(signed.signature[32:64], "big"), signed.signature[64]
    twin = SignedVoucher(signed.domain, signed.voucher, r + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v]))
    with pytest.raises(VoucherError, match="upper half"):
        twin.check()
    with pytest.raises(ChainRevert) as err:
        escrow.redeem(drafter, twin)
    assert err.value.name == "ECDSAInvalidSignatureS"


def test_a_voucher_larger_than_the_escrow_pays_what_is_there_and_the_rest_later(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.deposit(op, 1000)
    signed = voucher(escrow, op, address(drafter), 2500)
    done = escrow.redeem(drafter, signed)
    assert (done.amount, done.short) == (1000, 1500)
    assert escrow.owed(address(op), address(drafter)) == 1500
    escrow.deposit(op, 10_000)
    assert escrow.redeem(drafter, signed).amount == 1500  # the same voucher pays the rest
    assert escrow.owed(address(op), address(drafter)) == 0


def test_a_withdrawal_waits_out_the_delay_and_the_drafter_redeems_first(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.deposit(op, DEPOSIT)
    signed = voucher(escrow, op, address(drafter), 7000)
    escrow.request_withdrawal(op, DEPOSIT)  # all of it: a run on the escrow
    with pytest.raises(ChainRevert) as err:
        escrow.withdraw(op)
    assert err.value.name == "WithdrawalNotReady"
    warp(chain, DEFAULT_WITHDRAWAL_DELAY_S // 2)  # inside the delay, the drafter redeems in full
    assert escrow.redeem(drafter, signed).amount == 7000
    warp(chain, DEFAULT_WITHDRAWAL_DELAY_S)
    before = balance(escrow, address(op))
    tx = escrow.withdraw(op)
    assert balance(escrow, address(op)) == before + DEPOSIT - 7000 - gas_cost(escrow, tx.tx_hash)  # never more
    assert escrow.state(address(op)).balance == 0
