// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowHelpers} from "../utils/EscrowFixture.sol";
import {EscrowHandler} from "./EscrowHandler.sol";
import {DrafterEscrow} from "../../src/DrafterEscrow.sol";

/// @dev Handler-based invariants: forge calls random sequences of EscrowHandler's actions
///      (deposit, depositFor, withdraw, fundLane from the pool and/or with ETH, sign, redeem with
///      good and bad vouchers, operators' self-vouchers, requestThaw, cancelThaw, thaw, warp) and
///      checks every invariant after each call.
contract DrafterEscrowInvariantTest is EscrowHelpers {
    struct FuzzSelector {
        address addr;
        bytes4[] selectors;
    }

    DrafterEscrow internal escrow;
    EscrowHandler internal handler;

    function setUp() public {
        vm.warp(1_700_000_000);
        // the shortest period allowed, so that random warps cross redeem windows and readyAt often
        escrow = new DrafterEscrow(2 hours);
        handler = new EscrowHandler(escrow);
        // start with every operator's pool funded, so that lanes can be funded at call one
        for (uint256 i; i < handler.N_OPS(); ++i) {
            handler.deposit(i, 5 ether);
        }
        // and one lane of each operator's first drafter funded from it
        for (uint256 i; i < handler.N_OPS(); ++i) {
            handler.fundLane(i, 0, 2 ether);
            assertTrue(
                handler.snapshot()[i * handler.N_PAYEES() * handler.N_IDS()].funded != 0, "setUp funded the lane"
            );
        }
    }

    /// forge's invariant runner reads these to decide what to call.
    function targetContracts() public view returns (address[] memory t) {
        t = new address[](1);
        t[0] = address(handler);
    }

    function targetSelectors() public view returns (FuzzSelector[] memory s) {
        bytes4[] memory sel = new bytes4[](17);
        sel[0] = EscrowHandler.deposit.selector;
        sel[1] = EscrowHandler.depositFor.selector;
        sel[2] = EscrowHandler.withdraw.selector;
        // funding, signing and redeeming are weighted up: most paths need a funded lane and a voucher
        sel[3] = EscrowHandler.fundLane.selector;
        sel[4] = EscrowHandler.fundLane.selector;
        sel[5] = EscrowHandler.sign.selector;
        sel[6] = EscrowHandler.sign.selector;
        sel[7] = EscrowHandler.redeem.selector;
        sel[8] = EscrowHandler.redeem.selector;
        sel[9] = EscrowHandler.selfVoucher.selector;
        sel[10] = EscrowHandler.requestThaw.selector;
        sel[11] = EscrowHandler.requestThaw.selector;
        sel[12] = EscrowHandler.cancelThaw.selector;
        sel[13] = EscrowHandler.thaw.selector;
        sel[14] = EscrowHandler.thaw.selector;
        sel[15] = EscrowHandler.warp.selector;
        sel[16] = EscrowHandler.warp.selector;
        s = new FuzzSelector[](1);
        s[0] = FuzzSelector(address(handler), sel);
    }

    function _lane(EscrowHandler.Snap memory x) internal view returns (LaneState memory) {
        return _laneOf(escrow, x.op, x.dr, x.id);
    }

    /// Money leaves a lane only by its drafter's redemptions or by a thaw from readyAt on: per
    /// lane, balance == funded - redeemed to that drafter - thawed after readyAt, and its paid is
    /// exactly what its redemptions paid. Each drafter holds exactly what its lanes paid it, and
    /// no operator's voucher to itself moved a drafter's lane.
    function invariant_laneFundsLeaveOnlyByRedeemOrExpiredThaw() public view {
        EscrowHandler.Snap[] memory snaps = handler.snapshot();
        address[] memory drs = new address[](handler.N_PAYEES() - 1);
        uint256[] memory paidTo = new uint256[](drs.length); // per drafter, over all its lanes
        for (uint256 d; d < drs.length; ++d) {
            drs[d] = handler.drafters(d);
        }
        for (uint256 i; i < snaps.length; ++i) {
            EscrowHandler.Snap memory x = snaps[i];
            LaneState memory s = _lane(x);
            assertEq(s.balance, x.funded - x.redeemed - x.thawed, "balance == funded - redeemed - thawed after readyAt");
            assertEq(s.paid, x.redeemed, "paid == what this lane's redemptions paid");
            for (uint256 d; d < drs.length; ++d) {
                if (x.dr == drs[d]) paidTo[d] += s.paid;
            }
        }
        for (uint256 d; d < drs.length; ++d) {
            assertEq(drs[d].balance, paidTo[d], "a drafter holds exactly what its own lanes paid it");
        }
        assertEq(handler.ghostEarlyThaw(), 0, "a thaw moved money before its readyAt");
        assertEq(handler.ghostSelfVoucherLeak(), 0, "a self-voucher moved a drafter's lane");
    }

    /// Drafters are never paid more than was ever deposited, and nothing is created or lost:
    /// the contract holds exactly Σ pools + Σ lane balances, and that plus Σ paid + Σ withdrawn
    /// is Σ deposited.
    function invariant_paidNeverExceedsDeposited() public view {
        EscrowHandler.Snap[] memory snaps = handler.snapshot();
        uint256 pools;
        uint256 lanes;
        uint256 paid;
        for (uint256 k; k < handler.N_OPS(); ++k) {
            pools += escrow.poolOf(handler.operators(k));
        }
        for (uint256 i; i < snaps.length; ++i) {
            LaneState memory s = _lane(snaps[i]);
            lanes += s.balance;
            paid += s.paid;
        }
        assertGe(handler.ghostDeposited(), paid, "sum of paid <= sum of deposits");
        assertEq(paid, handler.ghostPaid(), "sum of paid == what redemptions returned");
        assertEq(address(escrow).balance, pools + lanes, "held == sum of pools + sum of lane balances");
        assertEq(pools + lanes + paid + handler.ghostWithdrawn(), handler.ghostDeposited(), "conservation");
    }

    /// Per lane, paid never exceeds the largest cumulative voucher signed for it, owed is what
    /// the last redemption left unpaid (never more than that voucher leaves), and a voucher no
    /// newer than what was paid (a replay) pays nothing. Every call's outcome matched the
    /// handler's oracle.
    function invariant_noVoucherPaysTwice() public view {
        EscrowHandler.Snap[] memory snaps = handler.snapshot();
        for (uint256 i; i < snaps.length; ++i) {
            EscrowHandler.Snap memory x = snaps[i];
            LaneState memory s = _lane(x);
            assertGe(x.maxSigned, s.paid, "never paid beyond a signed voucher");
            assertGe(x.maxSigned - s.paid, s.owed, "owed within the newest voucher");
            assertEq(s.owed, x.owed, "owed == what the last redemption left unpaid");
        }
        assertEq(handler.ghostReplayPaid(), 0, "a replay paid");
        assertEq(handler.ghostUnexpected(), 0, "a call's outcome differed from the oracle");
    }

    /// The lane guarantee: with an honest operator (it signs only what balance - thawing -
    /// unredeemed covers) and diligent drafters (they redeem within REDEEM_WINDOW of each
    /// ThawRequested on their lane), what the operator signed and hasn't paid yet is always
    /// covered by the lane, and every diligent redemption was paid in full.
    function invariant_diligentDraftersPaidInFull() public view {
        EscrowHandler.Snap[] memory snaps = handler.snapshot();
        for (uint256 i; i < snaps.length; ++i) {
            EscrowHandler.Snap memory x = snaps[i];
            if (!x.honest) continue;
            LaneState memory s = _lane(x);
            assertGe(s.balance, x.latest - s.paid, "a covered voucher lost cover");
        }
        assertEq(handler.ghostDiligentShortchanged(), 0, "a diligent drafter was not paid in full");
    }

    /// The handler is not vacuous: one long seeded sequence of its actions reaches every path
    /// and keeps every invariant after every call.
    function test_handler_reachesEveryPath_succeeds() public {
        uint256 seed = 0x5EED;
        for (uint256 i; i < 600; ++i) {
            seed = uint256(keccak256(abi.encode(seed)));
            _dispatch(seed % 17, seed >> 8);
            // external calls: each check starts with fresh memory
            this.invariant_laneFundsLeaveOnlyByRedeemOrExpiredThaw();
            this.invariant_paidNeverExceedsDeposited();
            this.invariant_noVoucherPaysTwice();
            this.invariant_diligentDraftersPaidInFull();
        }
        assertTrue(handler.redemptions() > 0, "vouchers were redeemed");
        assertTrue(handler.partialRedemptions() > 0, "a voucher was paid in part");
        assertTrue(handler.diligentRedemptions() > 0, "diligent drafters redeemed within a window");
        assertTrue(handler.emptyRejected() > 0, "an empty lane refused a voucher");
        assertTrue(handler.replaysRejected() > 0, "a replayed voucher was refused");
        assertTrue(handler.badVouchersRejected() > 0, "wrong callers and forged vouchers were refused");
        assertTrue(handler.laneMovedRejected() > 0, "a voucher moved to another lane was refused");
        assertTrue(handler.selfVouchers() > 0, "operators signed vouchers to themselves");
        assertTrue(handler.selfVouchersPaid() > 0, "a self-voucher was paid from its own self-lane");
        assertTrue(handler.withdrawals() > 0, "a withdrawal completed");
        assertTrue(handler.withdrawalsRejected() > 0, "a withdrawal was refused");
        assertTrue(handler.fundedFromPool() > 0, "a lane was funded from the pool");
        assertTrue(handler.fundedWithValue() > 0, "a lane was funded with ETH");
        assertTrue(handler.fundedBoth() > 0, "a lane was funded from both");
        assertTrue(handler.fundingRejected() > 0, "a funding was refused");
        assertTrue(handler.thaws() > 0, "a thaw completed");
        assertTrue(handler.cutThaws() > 0, "a thaw got only what redemptions left");
        assertTrue(handler.notReadyRejected() > 0, "an early thaw was refused");
        assertTrue(handler.cancellations() > 0, "a request was cancelled");
        assertTrue(handler.replacedRequests() > 0, "a request replaced an earlier one");
    }

    function _dispatch(uint256 action, uint256 x) internal {
        uint256 y = uint256(keccak256(abi.encode(x)));
        uint256 z = uint256(keccak256(abi.encode(y)));
        if (action == 0) handler.deposit(x, y);
        else if (action == 1) handler.depositFor(x, y);
        else if (action == 2) handler.withdraw(x, y);
        else if (action <= 4) handler.fundLane(x, y, z);
        else if (action <= 6) handler.sign(x, y, z);
        else if (action <= 8) handler.redeem(x, y, z);
        else if (action == 9) handler.selfVoucher(x, y, z);
        else if (action <= 11) handler.requestThaw(x, y, z);
        else if (action == 12) handler.cancelThaw(x, y);
        else if (action <= 14) handler.thaw(x, y);
        else handler.warp(x);
    }
}
