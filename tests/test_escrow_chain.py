"""DrafterEscrow on a real anvil, driven from Python: the vouchers node.chain.vouchers signs are the
ones the contract pays, every attack on a voucher reverts with the contract's own error, and the
lanes hold what they promise (an operator's self-voucher, a second ledger under the same key).

The contract's own Foundry suite covers the same rules exhaustively (contracts/test/DrafterEscrow*);
this file checks that the Python side (hashing, signing, the client) agrees with it byte for byte.
"""

from __future__ import annotations

import pytest
from chainutil import deployed_chain, warp
from eth_account import Account

from node.chain.client import ChainRevert
from node.chain.deployment import DEFAULT_THAWING_PERIOD_S, DEV_DEPLOYER, ETHER, dev_key
from node.chain.escrow import EscrowClient
from node.chain.receipts import SECP256K1_N
from node.chain.vouchers import SignedVoucher, Voucher, VoucherError, escrow_domain, sign_voucher

DEPOSIT = ETHER // 10
LANE = 7


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


def voucher(
    escrow: EscrowClient, operator_key: bytes, drafter: str, wei: int, domain=None, lane: int = LANE
) -> SignedVoucher:
    v = Voucher(address(operator_key), drafter, lane, wei, 1_700_000_000)
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
    escrow.fund_lane(op, address(drafter), LANE, 0, value=DEPOSIT)
    first = voucher(escrow, op, address(drafter), 3000)
    before = balance(escrow, address(drafter))
    done = escrow.redeem(drafter, first)
    assert (done.amount, done.short) == (3000, 0)
    assert balance(escrow, address(drafter)) == before + 3000 - gas_cost(escrow, done.tx.tx_hash)
    second = voucher(escrow, op, address(drafter), 5000)
    assert escrow.redeem(drafter, second).amount == 2000  # cumulative: only the difference
    assert escrow.lane(address(op), address(drafter), LANE).paid == 5000
    for old in (first, second):  # an older or equal voucher pays nothing
        with pytest.raises(ChainRevert) as err:
            escrow.redeem(drafter, old)
        assert err.value.name == "VoucherNotNewer"
        assert err.value.values == {"cumulativeWei": old.voucher.cumulative_wei, "paid": 5000}
    assert escrow.lane(address(op), address(drafter), LANE).balance == DEPOSIT - 5000


def test_a_forged_voucher_reverts_bad_signer(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=DEPOSIT)
    forged = sign_voucher(
        drafter, escrow.domain, Voucher(address(op), address(drafter), LANE, 10**15, 0)
    )  # self-signed
    with pytest.raises(VoucherError):
        forged.check()
    with pytest.raises(ChainRevert) as err:
        escrow.redeem(drafter, forged)
    assert err.value.name == "BadSigner" and err.value.values["recovered"] == address(drafter)


def test_another_drafters_voucher_cannot_be_redeemed(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter, thief = funded(chain), funded(chain), funded(chain)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=DEPOSIT)
    signed = voucher(escrow, op, address(drafter), 4000)
    with pytest.raises(ChainRevert) as err:
        escrow.redeem(thief, signed)
    assert err.value.name == "NotVoucherDrafter"
    assert err.value.values == {"caller": address(thief), "drafter": address(drafter)}
    assert escrow.lane(address(op), address(drafter), LANE).paid == 0


def test_a_voucher_for_another_chain_or_escrow_is_refused(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=DEPOSIT)
    elsewhere = [escrow_domain(1, escrow.address), escrow_domain(escrow.domain.chain_id, chain.deployment.address)]
    for domain in elsewhere:
        signed = voucher(escrow, op, address(drafter), 4000, domain)
        with pytest.raises(ChainRevert) as err:  # sent as if it were for this escrow: the digest differs
            escrow.redeem(drafter, SignedVoucher(escrow.domain, signed.voucher, signed.signature))
        assert err.value.name == "BadSigner"


def test_a_high_s_twin_is_refused_in_python_and_on_chain(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=DEPOSIT)
    signed = voucher(escrow, op, address(drafter), 4000)
    r, s, v = signed.signature[:32], int.from_bytes(signed.signature[32:64], "big"), signed.signature[64]
    twin = SignedVoucher(signed.domain, signed.voucher, r + (SECP256K1_N - s).to_bytes(32, "big") + bytes([55 - v]))
    with pytest.raises(VoucherError, match="upper half"):
        twin.check()
    with pytest.raises(ChainRevert) as err:
        escrow.redeem(drafter, twin)
    assert err.value.name == "ECDSAInvalidSignatureS"


def test_a_voucher_larger_than_its_lane_pays_what_is_there_and_the_rest_later(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=1000)
    signed = voucher(escrow, op, address(drafter), 2500)
    done = escrow.redeem(drafter, signed)
    assert (done.amount, done.short) == (1000, 1500)
    assert escrow.lane(address(op), address(drafter), LANE).owed == 1500
    escrow.deposit(op, 10_000)
    escrow.fund_lane(op, address(drafter), LANE, 10_000)  # from the pool
    assert escrow.redeem(drafter, signed).amount == 1500  # the same voucher pays the rest
    assert escrow.lane(address(op), address(drafter), LANE).owed == 0


def test_a_thaw_waits_out_the_period_and_the_drafter_redeems_first(escrow_chain):
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=DEPOSIT)
    signed = voucher(escrow, op, address(drafter), 7000)
    escrow.request_thaw(op, address(drafter), LANE, DEPOSIT)  # all of it: a run on the lane
    with pytest.raises(ChainRevert) as err:
        escrow.thaw(op, address(drafter), LANE)
    assert err.value.name == "ThawNotReady"
    warp(chain, DEFAULT_THAWING_PERIOD_S // 2)  # inside the period, the drafter redeems in full
    assert escrow.redeem(drafter, signed).amount == 7000
    warp(chain, DEFAULT_THAWING_PERIOD_S)
    escrow.thaw(op, address(drafter), LANE)
    assert escrow.lane(address(op), address(drafter), LANE).balance == 0
    assert escrow.pool(address(op)) == DEPOSIT - 7000  # never more than the drafter left
    before = balance(escrow, address(op))
    tx = escrow.withdraw(op, DEPOSIT - 7000)
    assert balance(escrow, address(op)) == before + DEPOSIT - 7000 - gas_cost(escrow, tx.tx_hash)


def test_the_operators_self_voucher_leaves_every_drafters_lane_whole(escrow_chain):
    """The attack: on the single-pool escrow an operator signed a voucher to itself for the whole
    pool and redeemed it, and its drafters' vouchers found the escrow empty. A lane pays only its own
    drafter: the self-voucher draws on the operator's own lane (empty), never on the drafter's."""
    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=DEPOSIT)
    owed = voucher(escrow, op, address(drafter), DEPOSIT)
    for lane in (LANE, 0):  # on the drafter's lane id and another: the operator's own lanes are empty
        with pytest.raises(ChainRevert) as err:
            escrow.redeem(op, voucher(escrow, op, address(op), 10 * DEPOSIT, lane=lane))
        assert err.value.name == "LaneEmpty"
    assert escrow.lane(address(op), address(drafter), LANE).balance == DEPOSIT
    assert escrow.redeem(drafter, owed).amount == DEPOSIT  # paid in full


def test_two_ledgers_under_one_key_never_underpay(escrow_chain, tmp_path):
    """The attack: two ledgers of one operator (a target restarted on a fresh data dir, a replica)
    each counted the drafter's total from 0 over the same (operator, drafter) key, so the second
    ledger's voucher only repeated the first and the drafter was paid the larger total, not the sum.
    Each ledger now has a lane of its own: the drafter is paid both jobs."""
    from market.ledger import Ledger
    from node.chain.paymaster import Paymaster, PaymentConfig

    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    price, accepted = 10**12, (40, 25)
    paymaster = Paymaster(escrow, op, PaymentConfig(price_wei=price, deposit_wei=DEPOSIT, lane_wei=10**15))
    paymaster.ensure_funded()
    vouchers = []
    for i, (name, tokens) in enumerate(zip(("old-dir", "new-dir"), accepted, strict=True)):
        with Ledger(tmp_path / name / "ledger.sqlite") as ledger:
            paymaster.cover(address(drafter), ledger.lane, 0, price * 64)  # as the target does on a payout
            signed = ledger.credit_and_pay(
                f"job-{i}", {"peer": (tokens, tokens)}, paymaster.pay({"peer": address(drafter)})
            )
            vouchers.append(SignedVoucher.loads(signed["peer"]))
    assert vouchers[0].voucher.lane != vouchers[1].voucher.lane
    paid = sum(escrow.redeem(drafter, v).amount for v in vouchers)
    assert paid == price * sum(accepted)


FAKE_ESCROW_RUNTIME = bytes.fromhex("7f" + "ff" * 32 + "60005260a06000f3")  # returns (2**256-1, 0, 0, 0, 0) to any call


def test_an_abi_mimic_is_not_the_escrow(escrow_chain):
    """A contract that answers DrafterEscrow's views (here: any lane holds 2**256-1 wei) looks like
    a funded lane to a drafter that only reads the ABI; its runtime code is not ours, so it is refused."""
    from node.chain.codehash import NotOurEscrow, check_escrow_code
    from node.chain.contract import send_signed
    from node.drafter.cover import CoverChecks
    from node.drafter.terms import Terms

    chain, escrow = escrow_chain
    w3 = escrow.w3
    creation = bytes.fromhex("6029" + "80" + "600b" + "6000" + "39" + "6000" + "f3") + FAKE_ESCROW_RUNTIME
    deployer = Account.from_key(dev_key(DEV_DEPLOYER))
    nonce = w3.eth.get_transaction_count(deployer.address, "pending")
    tx = {"from": deployer.address, "data": creation, "nonce": nonce, "gas": 200_000, "chainId": w3.eth.chain_id}
    tx["gasPrice"] = w3.eth.gas_price
    done = send_signed(w3, deployer, tx, "deploy a mimic")
    fake = w3.eth.get_transaction_receipt(done.tx_hash)["contractAddress"]
    op, drafter = funded(chain), funded(chain)
    assert EscrowClient(w3, fake).lane(address(op), address(drafter), LANE).balance == 2**256 - 1  # the lure
    with pytest.raises(NotOurEscrow, match="not the DrafterEscrow"):
        check_escrow_code(w3, fake)
    check_escrow_code(w3, escrow.address)  # the real one passes, whatever its thawing period
    terms = Terms(escrow.domain.chain_id, fake, address(op), LANE, 10**12, 64 * 10**12)
    with pytest.raises(NotOurEscrow):
        CoverChecks(chain.rpc).shortfall(terms, address(drafter), None)


def test_a_drafter_checks_its_lane_before_a_job(escrow_chain):
    """What a drafter with --rpc checks before each paid job: its lane, less a pending thaw, covers its
    unredeemed voucher plus the job's largest pay."""
    from node.drafter.cover import CoverChecks
    from node.drafter.terms import Terms

    chain, escrow = escrow_chain
    op, drafter = funded(chain), funded(chain)
    checks = CoverChecks(chain.rpc)
    terms = Terms(escrow.domain.chain_id, escrow.address, address(op), LANE, 10**12, 5000)
    assert "short of" in checks.shortfall(terms, address(drafter), None)  # nothing in the lane yet
    escrow.fund_lane(op, address(drafter), LANE, 0, value=8000)
    assert checks.shortfall(terms, address(drafter), None) == ""
    kept = voucher(escrow, op, address(drafter), 4000)  # 4000 unredeemed + 5000 > 8000
    assert "short of" in checks.shortfall(terms, address(drafter), kept)
    escrow.redeem(drafter, kept)  # 4000 paid: 4000 left, 0 unredeemed, a job of 5000 does not fit
    assert "short of" in checks.shortfall(terms, address(drafter), kept)
    escrow.fund_lane(op, address(drafter), LANE, 0, value=2000)
    assert checks.shortfall(terms, address(drafter), kept) == ""
    escrow.request_thaw(op, address(drafter), LANE, 1001)  # a pending thaw counts as gone
    assert "short of" in checks.shortfall(terms, address(drafter), kept)
