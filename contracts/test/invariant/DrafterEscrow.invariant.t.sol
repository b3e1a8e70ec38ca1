// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowHelpers} from "../utils/EscrowFixture.sol";
import {EscrowHandler} from "./EscrowHandler.sol";
import {DrafterEscrow} from "../../src/DrafterEscrow.sol";

/// @dev Handler-based invariants: forge calls random sequences of EscrowHandler's actions
///      (deposit, depositFor, sign, redeem with good and bad vouchers, requestWithdrawal,
///      cancelWithdrawal, withdraw, warp) and checks every invariant after each call.
contract DrafterEscrowInvariantTest is EscrowHelpers {
    struct FuzzSelector {
        address addr;
        bytes4[] selectors;
    }

    DrafterEscrow internal escrow;
    EscrowHandler internal handler;

    function setUp() public {
        vm.warp(1_700_000_000);
        // the shortest delay allowed, so that random warps cross redeem windows and readyAt often
        escrow = new DrafterEscrow(2 hours);
        handler = new EscrowHandler(escrow);
        // start with every operator funded, so that vouchers can be signed at call one
        for (uint256 i; i < handler.operatorCount(); ++i) {
            handler.deposit(i, 3 ether);
        }
    }

    /// forge's invariant runner reads these to decide what to call.
    function targetContracts() public view returns (address[] memory t) {
        t = new address[](1);
        t[0] = address(handler);
    }

    function targetSelectors() public view returns (FuzzSelector[] memory s) {
        bytes4[] memory sel = new bytes4[](12);
        sel[0] = EscrowHandler.deposit.selector;
        sel[1] = EscrowHandler.depositFor.selector;
        // signing and redeeming are weighted up: most paths need a voucher
        sel[2] = EscrowHandler.sign.selector;
        sel[3] = EscrowHandler.sign.selector;
        sel[4] = EscrowHandler.redeem.selector;
        sel[5] = EscrowHandler.redeem.selector;
        sel[6] = EscrowHandler.requestWithdrawal.selector;
        sel[7] = EscrowHandler.cancelWithdrawal.selector;
        sel[8] = EscrowHandler.withdraw.selector;
        sel[9] = EscrowHandler.withdraw.selector;
        sel[10] = EscrowHandler.warp.selector;
        sel[11] = EscrowHandler.warp.selector;
        s = new FuzzSelector[](1);
        s[0] = FuzzSelector(address(handler), sel);
    }

    function _sumBalances() internal view returns (uint256 sum) {
        uint256 n = handler.operatorCount();
        for (uint256 i; i < n; ++i) {
            sum += escrow.balanceOf(handler.operators(i));
        }
    }

    function _sumPaid() internal view returns (uint256 sum) {
        uint256 nOps = handler.operatorCount();
        uint256 nDr = handler.drafterCount();
        for (uint256 i; i < nOps; ++i) {
            for (uint256 d; d < nDr; ++d) {
                sum += escrow.paid(handler.operators(i), handler.drafters(d));
            }
        }
    }

    /// Drafters are never paid more than was ever deposited.
    function invariant_paidNeverExceedsDeposited() public view {
        assertGe(handler.ghostDeposited(), _sumPaid(), "sum of paid <= sum of deposits");
        assertEq(_sumPaid(), handler.ghostPaid(), "sum of paid == what redemptions returned");
    }

    /// Each (operator, drafter)'s paid only grows (it is exactly the sum of what its redemptions
    /// returned), never exceeds the newest voucher the operator signed for it, and owed is that
    /// voucher's remainder.
    function invariant_paidMonotonePerPair() public view {
        assertEq(handler.ghostPaidDecreased(), 0, "a paid amount shrank");
        uint256 nOps = handler.operatorCount();
        uint256 nDr = handler.drafterCount();
        for (uint256 i; i < nOps; ++i) {
            address op = handler.operators(i);
            for (uint256 d; d < nDr; ++d) {
                address dr = handler.drafters(d);
                uint256 p = escrow.paid(op, dr);
                assertEq(p, handler.ghostPaidPair(op, dr), "paid == sum of this pair's redemptions");
                assertGe(handler.latestSigned(op, dr), p, "never paid beyond a signed voucher");
                assertEq(escrow.owed(op, dr), handler.ghostOwed(op, dr), "owed");
            }
        }
    }

    /// Nothing is created or lost: Σ balances + Σ paid + Σ withdrawn == Σ deposited, and the
    /// contract holds exactly Σ balances. Every call's outcome matched the handler's oracle.
    function invariant_conservation() public view {
        uint256 balances = _sumBalances();
        assertEq(
            balances + _sumPaid() + handler.ghostWithdrawn(),
            handler.ghostDeposited(),
            "balances + paid + withdrawn == deposited"
        );
        assertEq(address(escrow).balance, balances, "held == sum of balances");
        assertEq(handler.ghostUnexpected(), 0, "a call's outcome differed from the oracle");
    }

    /// The timelock: with an honest operator (it signs only what its balance minus its pending
    /// withdrawal covers) and diligent drafters (they redeem within REDEEM_WINDOW of each
    /// request), what the operator signed and hasn't paid yet is always covered by its escrow,
    /// so no withdrawal ever takes what signed, covered vouchers need, and every diligent
    /// redemption was paid in full.
    function invariant_coveredVouchersRedeemableUntilReady() public view {
        address op = handler.honestOperator();
        uint256 balance = escrow.balanceOf(op);
        uint256 nDr = handler.drafterCount();
        for (uint256 d; d < nDr; ++d) {
            address dr = handler.drafters(d);
            assertGe(balance, handler.latestSigned(op, dr) - escrow.paid(op, dr), "a covered voucher lost cover");
        }
        assertGe(balance, handler.unredeemed(op), "covered vouchers together lost cover");
        assertEq(handler.ghostDiligentShortchanged(), 0, "a diligent drafter was not paid in full");
    }

    /// The handler is not vacuous: one long seeded sequence of its actions reaches every path
    /// and keeps every invariant after every call.
    function test_handler_reachesEveryPath_succeeds() public {
        uint256 seed = 0x5EED;
        for (uint256 i; i < 600; ++i) {
            seed = uint256(keccak256(abi.encode(seed)));
            _dispatch(seed % 12, seed >> 8);
            invariant_paidNeverExceedsDeposited();
            invariant_paidMonotonePerPair();
            invariant_conservation();
            invariant_coveredVouchersRedeemableUntilReady();
        }
        assertTrue(handler.redemptions() > 0, "vouchers were redeemed");
        assertTrue(handler.partialRedemptions() > 0, "a voucher was paid in part");
        assertTrue(handler.diligentRedemptions() > 0, "diligent drafters redeemed before a readyAt");
        assertTrue(handler.emptyRejected() > 0, "an empty escrow refused a voucher");
        assertTrue(handler.notNewerRejected() > 0, "a replayed voucher was refused");
        assertTrue(handler.badVouchersRejected() > 0, "wrong callers and forged vouchers were refused");
        assertTrue(handler.withdrawals() > 0, "a withdrawal completed");
        assertTrue(handler.cutWithdrawals() > 0, "a withdrawal got only what redemptions left");
        assertTrue(handler.notReadyRejected() > 0, "an early withdrawal was refused");
        assertTrue(handler.cancellations() > 0, "a request was cancelled");
        assertTrue(handler.replacedRequests() > 0, "a request replaced an earlier one");
    }

    function _dispatch(uint256 action, uint256 x) internal {
        uint256 y = uint256(keccak256(abi.encode(x)));
        if (action == 0) handler.deposit(x, y);
        else if (action == 1) handler.depositFor(x, y);
        else if (action <= 3) handler.sign(x, x >> 8, y);
        else if (action <= 5) handler.redeem(x, x >> 8, y);
        else if (action == 6) handler.requestWithdrawal(x, y);
        else if (action == 7) handler.cancelWithdrawal(x);
        else if (action <= 9) handler.withdraw(x);
        else handler.warp(x);
    }
}
