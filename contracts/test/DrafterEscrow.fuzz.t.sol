// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowFixture} from "./utils/EscrowFixture.sol";
import {DrafterEscrow} from "../src/DrafterEscrow.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @dev Property tests over amounts, voucher sequences, partial balances, keys, chain ids and time.
contract DrafterEscrowFuzzTest is EscrowFixture {
    function _min(uint256 a, uint256 b) internal pure returns (uint256) {
        return a < b ? a : b;
    }

    // -- constructor ------------------------------------------------------------------------

    function testFuzz_constructor_delayInRange_succeeds(uint256 delay) public {
        delay = bound(delay, 2 hours, 365 days);
        assertEq(new DrafterEscrow(delay).withdrawalDelay(), delay, "withdrawalDelay");
    }

    function testFuzz_constructor_delayOutOfRange_reverts(uint256 delay) public {
        if (delay >= 2 hours && delay <= 365 days) delay = delay % (2 hours); // below the range
        if (delay < 2 hours) {
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.DelayTooShort.selector, delay, 2 hours));
        } else {
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.DelayTooLong.selector, delay, 365 days));
        }
        new DrafterEscrow(delay);
    }

    // -- hashing and signatures -------------------------------------------------------------

    function testFuzz_voucherDigest_matchesReference(address op, address dr, uint256 cumulativeWei, uint64 issuedAt)
        public
        view
    {
        DrafterEscrow.Voucher memory v = DrafterEscrow.Voucher(op, dr, cumulativeWei, issuedAt);
        assertEq(escrow.voucherDigest(v), _refVoucherDigest(escrow, v), "voucherDigest");
    }

    function testFuzz_redeem_anyOperatorKey_succeeds(uint256 pk, uint96 amount, uint64 issuedAt) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        vm.assume(amount > 0 && pk != OPERATOR_PK);
        address op = vm.addr(pk);
        vm.deal(op, amount);
        vm.prank(op);
        escrow.deposit{value: amount}();
        DrafterEscrow.Voucher memory v = DrafterEscrow.Voucher(op, drafter, amount, issuedAt);
        bytes memory sig = _signVoucher(escrow, pk, v);
        bytes memory bad = _highS(sig);
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        _redeem(v, bad);
        assertEq(_redeem(v, sig), amount, "redeems in full");
        assertEq(escrow.balanceOf(op), 0, "escrow spent");
    }

    function testFuzz_redeem_wrongKey_reverts(uint256 pk) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        vm.assume(pk != OPERATOR_PK);
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
        bytes memory sig = _signVoucher(escrow, pk, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, vm.addr(pk), operator));
        _redeem(v, sig);
    }

    function testFuzz_redeem_voucherForAnyOtherChain_reverts(uint64 otherChain) public {
        vm.assume(otherChain != block.chainid);
        uint256 chain = block.chainid;
        vm.chainId(otherChain);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        vm.chainId(chain);
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function testFuzz_redeem_byAnyoneButDrafter_reverts(address caller) public {
        vm.assume(caller != drafter && caller != address(vm));
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NotVoucherDrafter.selector, caller, drafter));
        vm.prank(caller);
        escrow.redeem(v, sig);
    }

    // -- amounts ----------------------------------------------------------------------------

    function testFuzz_deposit_accumulates(uint96 a, uint96 b) public {
        vm.assume(a > 0 && b > 0);
        vm.deal(other, uint256(a) + b);
        vm.prank(other);
        escrow.deposit{value: a}();
        vm.deal(depositor, b);
        vm.prank(depositor);
        escrow.depositFor{value: b}(other);
        assertEq(escrow.balanceOf(other), uint256(a) + b, "sum");
        assertEq(address(escrow).balance, ESCROWED + uint256(a) + b, "held");
    }

    /// One voucher against any balance: pays min(voucher, balance), the rest is owed.
    function testFuzz_redeem_paysMinOfVoucherAndBalance(uint256 deposit_, uint256 cumulativeWei) public {
        deposit_ = bound(deposit_, 1, 1e30);
        cumulativeWei = bound(cumulativeWei, 1, type(uint256).max);
        vm.deal(other, deposit_);
        vm.prank(other);
        escrow.deposit{value: deposit_}();
        DrafterEscrow.Voucher memory v = _voucher(other, drafter, cumulativeWei);
        bytes memory sig = _signVoucher(escrow, OTHER_PK, v);
        uint256 expected = _min(cumulativeWei, deposit_);
        assertEq(_redeem(v, sig), expected, "min(voucher, balance)");
        assertEq(drafter.balance, expected, "drafter paid");
        assertEq(escrow.paid(other, drafter), expected, "paid");
        assertEq(escrow.owed(other, drafter), cumulativeWei - expected, "owed");
        assertEq(escrow.balanceOf(other), deposit_ - expected, "balance");
    }

    /// An increasing sequence of cumulative vouchers with top-ups in between: after each
    /// redemption paid == min(voucher, everything deposited), owed is the difference, and every
    /// older voucher is refused. Redeeming the newest voucher again after the last top-up pays
    /// whatever the escrow now covers.
    function testFuzz_redeem_cumulativeSequence(uint256 seed, uint256 n) public {
        n = bound(n, 1, 12);
        uint256 deposited = ESCROWED;
        uint256 cumulative;
        uint256 prevCumulative;
        DrafterEscrow.Voucher memory v;
        bytes memory sig;
        for (uint256 i; i < n; ++i) {
            seed = uint256(keccak256(abi.encode(seed, i)));
            prevCumulative = cumulative;
            cumulative += 1 + seed % 4 ether;
            if ((seed >> 128) % 3 == 0) {
                uint256 topUp = 1 + (seed >> 64) % 3 ether;
                vm.prank(depositor);
                escrow.depositFor{value: topUp}(operator);
                deposited += topUp;
            }
            (v, sig) = _signed(drafter, cumulative);
            uint256 paidBefore = escrow.paid(operator, drafter);
            if (paidBefore == deposited) {
                vm.expectRevert(
                    abi.encodeWithSelector(DrafterEscrow.EscrowEmpty.selector, operator, cumulative - paidBefore)
                );
                _redeem(v, sig);
                continue;
            }
            uint256 got = _redeem(v, sig);
            assertEq(got, _min(cumulative, deposited) - paidBefore, "increment or what is left");
            assertEq(escrow.paid(operator, drafter), _min(cumulative, deposited), "paid == min(voucher, deposits)");
            assertEq(escrow.owed(operator, drafter), cumulative - escrow.paid(operator, drafter), "owed");
            if (prevCumulative > escrow.paid(operator, drafter)) continue; // a top-up reopened it
            (DrafterEscrow.Voucher memory old, bytes memory oldSig) = _signed(drafter, prevCumulative);
            vm.expectRevert(
                abi.encodeWithSelector(
                    DrafterEscrow.VoucherNotNewer.selector, prevCumulative, escrow.paid(operator, drafter)
                )
            );
            _redeem(old, oldSig);
        }
        // the newest voucher after a final top-up that covers it
        uint256 shortfall = cumulative - escrow.paid(operator, drafter);
        if (shortfall != 0) {
            vm.prank(operator);
            escrow.deposit{value: shortfall}();
            assertEq(_redeem(v, sig), shortfall, "the same voucher pays the rest");
        }
        assertEq(drafter.balance, cumulative, "paid the newest voucher in full");
        assertEq(address(escrow).balance, escrow.balanceOf(operator), "held == the operator's escrow");
    }

    /// Two drafters share one escrow smaller than their vouchers: whoever redeems first is paid
    /// first, and the two never get more than the escrow together.
    function testFuzz_redeem_twoDraftersShareEscrow(uint256 a, uint256 b) public {
        a = bound(a, 1, 30 ether);
        b = bound(b, 1, 30 ether);
        uint256 gotA = _pay(drafter, a);
        uint256 left = ESCROWED - gotA;
        if (left == 0) {
            (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter2, b);
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.EscrowEmpty.selector, operator, b));
            _redeem(v, sig);
            return;
        }
        uint256 gotB = _pay(drafter2, b);
        assertEq(gotA, _min(a, ESCROWED), "first come");
        assertEq(gotB, _min(b, left), "then what is left");
        assertEq(gotA + gotB + escrow.balanceOf(operator), ESCROWED, "conservation");
    }

    // -- withdrawals and time ---------------------------------------------------------------

    function testFuzz_requestWithdrawal_aboveBalance_reverts(uint256 amount) public {
        amount = bound(amount, ESCROWED + 1, type(uint256).max);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsBalance.selector, amount, ESCROWED));
        vm.prank(operator);
        escrow.requestWithdrawal(amount);
    }

    /// withdraw is refused at every moment before readyAt and allowed at every moment from it.
    function testFuzz_withdraw_timing(uint256 amount, uint256 dt) public {
        amount = bound(amount, 1, ESCROWED);
        dt = bound(dt, 0, 3 * DELAY);
        uint64 readyAt = _requestWithdrawal(operator, amount);
        vm.warp(block.timestamp + dt);
        if (block.timestamp < readyAt) {
            vm.expectRevert(
                abi.encodeWithSelector(DrafterEscrow.WithdrawalNotReady.selector, readyAt, uint64(block.timestamp))
            );
            vm.prank(operator);
            escrow.withdraw();
            return;
        }
        vm.prank(operator);
        assertEq(escrow.withdraw(), amount, "the requested amount");
        assertEq(escrow.balanceOf(operator), ESCROWED - amount, "the rest stays");
    }

    /// Whatever drafters redeem during the delay, withdraw takes min(requested, what is left) and
    /// never touches what they were paid.
    function testFuzz_withdraw_afterRedemptions_takesAtMostRest(uint256 requested, uint256 a, uint256 b, uint256 dt)
        public
    {
        requested = bound(requested, 1, ESCROWED);
        a = bound(a, 1, 8 ether);
        b = bound(b, 1, 8 ether);
        dt = bound(dt, 0, DELAY - 1);
        uint64 readyAt = _requestWithdrawal(operator, requested);
        vm.warp(block.timestamp + dt);
        uint256 gotA = _pay(drafter, a);
        uint256 gotB = escrow.balanceOf(operator) == 0 ? 0 : _pay(drafter2, b);
        uint256 left = ESCROWED - gotA - gotB;
        vm.warp(readyAt);
        vm.prank(operator);
        uint256 out = escrow.withdraw();
        assertEq(out, _min(requested, left), "min(requested, left)");
        assertEq(escrow.balanceOf(operator), left - out, "balance");
        assertEq(drafter.balance + drafter2.balance, gotA + gotB, "drafters keep what they redeemed");
        assertEq(address(escrow).balance, escrow.balanceOf(operator), "held");
    }

    /// The timelock guarantee: vouchers the escrow covered at the request (here up to the whole
    /// balance, split between two drafters) are paid in full when redeemed within REDEEM_WINDOW,
    /// whatever the operator asked to withdraw; any later request only restarts the clock.
    function testFuzz_timelock_coveredVouchersPaidInFull(
        uint256 a,
        uint256 b,
        uint256 requested,
        uint256 redeemAfter,
        bool rerequest
    ) public {
        a = bound(a, 1, ESCROWED - 1);
        b = bound(b, 1, ESCROWED - a);
        requested = bound(requested, 1, ESCROWED);
        redeemAfter = bound(redeemAfter, 0, escrow.REDEEM_WINDOW());
        (DrafterEscrow.Voucher memory va, bytes memory sa) = _signed(drafter, a);
        (DrafterEscrow.Voucher memory vb, bytes memory sb) = _signed(drafter2, b);
        uint64 readyAt = _requestWithdrawal(operator, requested);
        if (rerequest) {
            vm.warp(block.timestamp + redeemAfter / 2);
            readyAt = _requestWithdrawal(operator, ESCROWED); // the whole escrow, clock restarted
        }
        vm.warp(block.timestamp + redeemAfter);
        assertTrue(block.timestamp < readyAt, "the window ends before readyAt");
        assertEq(_redeem(va, sa), a, "drafter paid in full");
        assertEq(_redeem(vb, sb), b, "drafter2 paid in full");
        vm.warp(readyAt);
        vm.prank(operator);
        assertEq(escrow.withdraw(), _min(rerequest ? ESCROWED : requested, ESCROWED - a - b), "withdraws the rest");
    }
}
