// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowFixture} from "./utils/EscrowFixture.sol";
import {DrafterEscrow} from "../src/DrafterEscrow.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @dev Property tests over amounts, lanes, voucher sequences, keys, chain ids and time.
contract DrafterEscrowFuzzTest is EscrowFixture {
    uint256 internal constant HELD = POOLED + LANED;

    /// The sequence's state: per lane k (drafter k / 3, lane id 7 + k % 3), the newest voucher
    /// and what was funded into the lane.
    uint256[6] internal seqCumulative;
    uint256[6] internal seqFunded;

    function _min(uint256 a, uint256 b) internal pure returns (uint256) {
        return a < b ? a : b;
    }

    // -- constructor ------------------------------------------------------------------------

    function testFuzz_constructor_periodInRange_succeeds(uint256 period) public {
        period = bound(period, 2 hours, 365 days);
        assertEq(new DrafterEscrow(period).thawingPeriod(), period, "thawingPeriod");
    }

    function testFuzz_constructor_periodOutOfRange_reverts(uint256 period) public {
        if (period >= 2 hours && period <= 365 days) period = period % (2 hours); // below the range
        if (period < 2 hours) {
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawingPeriodTooShort.selector, period, 2 hours));
        } else {
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawingPeriodTooLong.selector, period, 365 days));
        }
        new DrafterEscrow(period);
    }

    // -- hashing and signatures -------------------------------------------------------------

    function testFuzz_voucherDigest_matchesReference(
        address op,
        address dr,
        uint64 laneId,
        uint256 cumulativeWei,
        uint64 issuedAt
    ) public view {
        DrafterEscrow.Voucher memory v = DrafterEscrow.Voucher(op, dr, laneId, cumulativeWei, issuedAt);
        assertEq(escrow.voucherDigest(v), _refVoucherDigest(escrow, v), "voucherDigest");
    }

    function testFuzz_redeem_anyOperatorKey_succeeds(uint256 pk, uint96 amount, uint64 laneId, uint64 issuedAt) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        vm.assume(amount > 0 && pk != OPERATOR_PK);
        address op = vm.addr(pk);
        vm.deal(op, amount);
        vm.prank(op);
        escrow.fundLane{value: amount}(drafter, laneId, 0);
        DrafterEscrow.Voucher memory v = DrafterEscrow.Voucher(op, drafter, laneId, amount, issuedAt);
        bytes memory sig = _signVoucher(escrow, pk, v);
        bytes memory bad = _highS(sig);
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        _redeem(v, bad);
        assertEq(_redeem(v, sig), amount, "redeems in full");
        assertEq(_laneOf(escrow, op, drafter, laneId).balance, 0, "lane spent");
        assertEq(_main().balance, LANED, "the fixture's lane untouched");
    }

    function testFuzz_redeem_wrongKey_reverts(uint256 pk) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        vm.assume(pk != OPERATOR_PK);
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        bytes memory sig = _signVoucher(escrow, pk, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, vm.addr(pk), operator));
        _redeem(v, sig);
    }

    function testFuzz_redeem_voucherForAnyOtherChain_reverts(uint64 otherChain) public {
        vm.assume(otherChain != block.chainid);
        uint256 chain = block.chainid;
        vm.chainId(otherChain);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        vm.chainId(chain);
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function testFuzz_redeem_byAnyoneButDrafter_reverts(address caller) public {
        vm.assume(caller != drafter && caller != address(vm));
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NotVoucherDrafter.selector, caller, drafter));
        vm.prank(caller);
        escrow.redeem(v, sig);
    }

    /// A voucher signed for any other lane id, moved onto the funded lane, never verifies.
    function testFuzz_redeem_signedForOtherLane_reverts(uint64 signedLane) public {
        vm.assume(signedLane != LANE);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, signedLane, 1 ether);
        v.lane = LANE;
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
        assertEq(_main().balance, LANED, "lane untouched");
    }

    // -- pools and lanes --------------------------------------------------------------------

    function testFuzz_deposit_accumulates(uint96 a, uint96 b) public {
        vm.assume(a > 0 && b > 0);
        vm.deal(other, uint256(a) + b);
        vm.prank(other);
        escrow.deposit{value: a}();
        vm.deal(depositor, b);
        vm.prank(depositor);
        escrow.depositFor{value: b}(other);
        assertEq(escrow.poolOf(other), uint256(a) + b, "sum");
        assertEq(address(escrow).balance, HELD + uint256(a) + b, "held");
    }

    /// A withdrawal up to the pool leaves at once; above it (into the lane's money) it reverts.
    function testFuzz_withdraw_onlyThePool(uint256 amount) public {
        amount = bound(amount, 1, type(uint256).max);
        if (amount > POOLED) {
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, amount, POOLED));
            vm.prank(operator);
            escrow.withdraw(amount);
            return;
        }
        uint256 before = operator.balance;
        vm.prank(operator);
        assertEq(escrow.withdraw(amount), amount, "withdrawn");
        assertEq(operator.balance, before + amount, "sent");
        assertEq(_main().balance, LANED, "the lane is untouched");
    }

    /// fundLane takes msg.value plus up to the whole pool, and nothing above it.
    function testFuzz_fundLane_sources(uint96 value, uint256 fromPool, uint64 laneId) public {
        fromPool = bound(fromPool, 0, POOLED + 1 ether);
        vm.deal(operator, value);
        uint256 before = _laneOf(escrow, operator, drafter2, laneId).balance;
        if (value == 0 && fromPool == 0) {
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        } else if (fromPool > POOLED) {
            vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, fromPool, POOLED));
        }
        vm.prank(operator);
        escrow.fundLane{value: value}(drafter2, laneId, fromPool);
        if (fromPool > POOLED || value == 0 && fromPool == 0) return;
        assertEq(_laneOf(escrow, operator, drafter2, laneId).balance, before + value + fromPool, "lane");
        assertEq(escrow.poolOf(operator), POOLED - fromPool, "pool");
        assertEq(address(escrow).balance, HELD + value, "held");
    }

    /// One voucher against any lane balance: pays min(voucher, lane), the rest is owed.
    function testFuzz_redeem_paysMinOfVoucherAndLane(uint256 funded, uint256 cumulativeWei) public {
        funded = bound(funded, 1, 1e30);
        cumulativeWei = bound(cumulativeWei, 1, type(uint256).max);
        vm.deal(other, funded);
        vm.prank(other);
        escrow.fundLane{value: funded}(drafter, LANE, 0);
        DrafterEscrow.Voucher memory v = _voucher(other, drafter, LANE, cumulativeWei);
        bytes memory sig = _signVoucher(escrow, OTHER_PK, v);
        uint256 expected = _min(cumulativeWei, funded);
        assertEq(_redeem(v, sig), expected, "min(voucher, lane)");
        assertEq(drafter.balance, expected, "drafter paid");
        LaneState memory s = _laneOf(escrow, other, drafter, LANE);
        assertEq(s.paid, expected, "paid");
        assertEq(s.owed, cumulativeWei - expected, "owed");
        assertEq(s.balance, funded - expected, "balance");
        assertEq(_main().balance, LANED, "the operator's lane for the same drafter and id");
    }

    /// Increasing cumulative vouchers on several lanes (two drafters, lane ids 7, 8, 9) with
    /// random top-ups: after each redemption a lane's paid == min(its newest voucher, what was
    /// funded into it), owed is the difference, every other lane is unchanged, and an older
    /// voucher on the lane is refused. The newest voucher of each lane, redeemed after a final
    /// top-up, pays the rest.
    function testFuzz_redeem_sequencesOnSeveralLanes(uint256 seed, uint256 n) public {
        n = bound(n, 1, 16);
        seqFunded[0] = LANED; // (drafter, 7)
        for (uint256 i; i < n; ++i) {
            seed = uint256(keccak256(abi.encode(seed, i)));
            _seqStep(seed);
        }
        for (uint256 k; k < 6; ++k) {
            (address dr, uint64 id) = _seqLane(k);
            uint256 shortfall = seqCumulative[k] - _laneOf(escrow, operator, dr, id).paid;
            if (shortfall == 0) continue;
            vm.prank(operator);
            escrow.fundLane{value: shortfall}(dr, id, 0);
            assertEq(_pay(dr, id, seqCumulative[k]), shortfall, "the newest voucher pays the rest");
        }
        assertEq(
            drafter.balance, seqCumulative[0] + seqCumulative[1] + seqCumulative[2], "drafter: its newest vouchers"
        );
        assertEq(
            drafter2.balance, seqCumulative[3] + seqCumulative[4] + seqCumulative[5], "drafter2: its newest vouchers"
        );
    }

    function _seqLane(uint256 k) internal view returns (address dr, uint64 id) {
        (dr, id) = (k < 3 ? drafter : drafter2, uint64(7 + k % 3));
    }

    /// One step: maybe a top-up, then a newer voucher on lane seed % 6, redeemed.
    function _seqStep(uint256 seed) internal {
        uint256 k = seed % 6;
        (address dr, uint64 id) = _seqLane(k);
        if ((seed >> 128) % 3 == 0) {
            uint256 topUp = 1 + (seed >> 64) % 3 ether;
            vm.prank(operator);
            escrow.fundLane{value: topUp}(dr, id, 0);
            seqFunded[k] += topUp;
        }
        uint256 prev = seqCumulative[k];
        seqCumulative[k] += 1 + (seed >> 32) % 4 ether;
        uint256 paidBefore = _laneOf(escrow, operator, dr, id).paid;
        bytes32 othersBefore = _othersHash(k);
        if (paidBefore == seqFunded[k]) {
            bytes memory err = abi.encodeWithSelector(
                DrafterEscrow.LaneEmpty.selector, operator, dr, id, seqCumulative[k] - paidBefore
            );
            (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(dr, id, seqCumulative[k]);
            vm.expectRevert(err);
            _redeem(v, sig);
            return;
        }
        uint256 expected = _min(seqCumulative[k], seqFunded[k]);
        assertEq(_pay(dr, id, seqCumulative[k]), expected - paidBefore, "increment or what is left");
        LaneState memory s = _laneOf(escrow, operator, dr, id);
        assertEq(s.paid, expected, "paid == min(voucher, funded)");
        assertEq(s.owed, seqCumulative[k] - s.paid, "owed");
        assertEq(s.balance, seqFunded[k] - s.paid, "balance");
        assertEq(_othersHash(k), othersBefore, "the other lanes are unchanged");
        if (prev > s.paid || prev == 0) return; // a top-up reopened it, or nothing older
        (DrafterEscrow.Voucher memory old, bytes memory oldSig) = _signed(dr, id, prev);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, prev, s.paid));
        _redeem(old, oldSig);
    }

    /// The lanes other than lane k of the sequence, hashed.
    function _othersHash(uint256 k) internal view returns (bytes32 h) {
        for (uint256 j; j < 6; ++j) {
            if (j == k) continue;
            (address dr, uint64 id) = _seqLane(j);
            h = keccak256(abi.encode(h, _laneOf(escrow, operator, dr, id)));
        }
    }

    /// The operator's voucher to itself, on any lane id and for any amount, never moves the
    /// drafter's lane; the drafter's own voucher still pays in full.
    function testFuzz_redeem_selfVoucherNeverTouchesDrafterLane(uint64 laneId, uint256 amount, uint256 selfFunded)
        public
    {
        amount = bound(amount, 1, type(uint256).max);
        selfFunded = bound(selfFunded, 0, POOLED);
        if (selfFunded != 0) {
            vm.prank(operator);
            escrow.fundLane(operator, laneId, selfFunded);
        }
        DrafterEscrow.Voucher memory self = _voucher(operator, operator, laneId, amount);
        bytes memory selfSig = _signVoucher(escrow, OPERATOR_PK, self);
        if (selfFunded == 0) {
            vm.expectRevert(
                abi.encodeWithSelector(DrafterEscrow.LaneEmpty.selector, operator, operator, laneId, amount)
            );
            vm.prank(operator);
            escrow.redeem(self, selfSig);
        } else {
            vm.prank(operator);
            assertEq(escrow.redeem(self, selfSig), _min(amount, selfFunded), "its own lane only");
        }
        assertEq(_main().balance, LANED, "the drafter's lane is unchanged");
        assertEq(_pay(drafter, LANE, LANED), LANED, "the drafter's voucher pays in full");
    }

    // -- thaws and time ---------------------------------------------------------------------

    function testFuzz_requestThaw_aboveLane_reverts(uint256 amount) public {
        amount = bound(amount, LANED + 1, type(uint256).max);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsLane.selector, amount, LANED));
        vm.prank(operator);
        escrow.requestThaw(drafter, LANE, amount);
    }

    /// thaw is refused at every moment before readyAt and allowed at every moment from it.
    function testFuzz_thaw_timing(uint256 amount, uint256 dt) public {
        amount = bound(amount, 1, LANED);
        dt = bound(dt, 0, 3 * PERIOD);
        uint64 readyAt = _requestThaw(operator, drafter, LANE, amount);
        vm.warp(block.timestamp + dt);
        if (block.timestamp < readyAt) {
            vm.expectRevert(
                abi.encodeWithSelector(DrafterEscrow.ThawNotReady.selector, readyAt, uint64(block.timestamp))
            );
            vm.prank(operator);
            escrow.thaw(drafter, LANE);
            return;
        }
        vm.prank(operator);
        assertEq(escrow.thaw(drafter, LANE), amount, "the requested amount");
        assertEq(_main().balance, LANED - amount, "the rest stays");
        assertEq(escrow.poolOf(operator), POOLED + amount, "into the pool");
    }

    /// Whatever the drafter redeems during the period, thaw takes min(requested, what is left)
    /// and never touches what it was paid.
    function testFuzz_thaw_afterRedemptions_takesAtMostRest(uint256 requested, uint256 a, uint256 b, uint256 dt)
        public
    {
        requested = bound(requested, 1, LANED);
        a = bound(a, 1, 8 ether);
        b = bound(b, a + 1, a + 8 ether);
        dt = bound(dt, 0, PERIOD - 1);
        uint64 readyAt = _requestThaw(operator, drafter, LANE, requested);
        vm.warp(block.timestamp + dt);
        uint256 got = _pay(drafter, LANE, a);
        if (_main().balance != 0) got += _pay(drafter, LANE, b);
        uint256 left = LANED - got;
        vm.warp(readyAt);
        vm.prank(operator);
        uint256 out = escrow.thaw(drafter, LANE);
        assertEq(out, _min(requested, left), "min(requested, left)");
        assertEq(_main().balance, left - out, "balance");
        assertEq(drafter.balance, got, "the drafter keeps what it redeemed");
        assertEq(address(escrow).balance, escrow.poolOf(operator) + _main().balance, "held");
    }

    /// The lane guarantee: a drafter whose check held before its job (balance - thawing >=
    /// unredeemed + job) and that redeems within REDEEM_WINDOW of any ThawRequested is paid its
    /// signed vouchers, the job's included, in full, whatever the operator asks to thaw and
    /// whether it re-requests; the thaw takes only the rest.
    function testFuzz_guarantee_diligentDrafterPaidInFull(
        uint256 redeemed,
        uint256 unredeemed,
        uint256 job,
        uint256 requested,
        uint256 redeemAfter,
        bool rerequest
    ) public {
        redeemed = bound(redeemed, 0, LANED - 2);
        unredeemed = bound(unredeemed, 1, LANED - redeemed - 1);
        job = bound(job, 1, LANED - redeemed - unredeemed);
        redeemAfter = bound(redeemAfter, 0, escrow.REDEEM_WINDOW());
        if (redeemed != 0) _pay(drafter, LANE, redeemed);
        LaneState memory s = _main();
        assertGe(s.balance - s.thawing, unredeemed + job, "the drafter's check");
        requested = bound(requested, 1, s.balance);
        uint64 readyAt = _requestThaw(operator, drafter, LANE, requested);
        // the job is done and vouched for after the request
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, redeemed + unredeemed + job);
        if (rerequest) {
            vm.warp(block.timestamp + redeemAfter / 2);
            readyAt = _requestThaw(operator, drafter, LANE, s.balance); // the whole lane, clock restarted
        }
        vm.warp(block.timestamp + redeemAfter);
        assertTrue(block.timestamp < readyAt, "the window ends before readyAt");
        assertEq(_redeem(v, sig), unredeemed + job, "paid in full");
        vm.warp(readyAt);
        vm.prank(operator);
        assertEq(
            escrow.thaw(drafter, LANE),
            _min(rerequest ? s.balance : requested, s.balance - unredeemed - job),
            "thaws the rest"
        );
        assertEq(drafter.balance, redeemed + unredeemed + job, "every voucher paid");
    }
}
