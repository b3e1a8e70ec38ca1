// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowHelpers} from "../utils/EscrowFixture.sol";
import {DrafterEscrow} from "../../src/DrafterEscrow.sol";

/// @dev Drives DrafterEscrow through random sequences of deposits, voucher signing, redemptions
///      (good ones and bad ones: replays, wrong callers, forged signatures), withdrawal requests,
///      cancellations, withdrawals and time warps, with real operator signatures. Every call's
///      outcome is checked against the handler's own oracle (success and amount, or the exact
///      revert), and ghost accounting backs the invariants.
///
///      Operator 0 is honest and its drafters diligent, the model the timelock is built for: it
///      signs only vouchers its balance minus its pending withdrawal covers together with
///      everything signed and not yet redeemed, and its drafters redeem their newest vouchers
///      within REDEEM_WINDOW of each `WithdrawalRequested` (just before a warp would carry time
///      past that). Operators 1 and 2 sign whatever they like (more than they hold, so vouchers
///      get paid in part) and their drafters redeem whenever.
contract EscrowHandler is EscrowHelpers {
    DrafterEscrow public immutable escrow;
    uint256 public immutable redeemWindow;

    uint256[] internal opPks;
    address[] public operators;
    address[] public drafters;
    address internal constant DEPOSITOR = address(0xDE90);
    uint256 internal constant FORGER_PK = 0xF0F0;
    uint256 internal constant HONEST = 0; // index of the honest operator

    /// The newest voucher each operator signed for each drafter, and the one before it.
    mapping(address => mapping(address => uint256)) public latestSigned;
    mapping(address => mapping(address => bytes)) internal latestSig;
    mapping(address => mapping(address => uint256)) internal prevSigned;
    mapping(address => mapping(address => bytes)) internal prevSig;
    mapping(address => mapping(address => uint64)) internal latestIssuedAt;
    mapping(address => mapping(address => uint64)) internal prevIssuedAt;

    // ---- ghost state ----------------------------------------------------------------------
    uint256 public ghostDeposited;
    uint256 public ghostPaid;
    uint256 public ghostWithdrawn;
    mapping(address => mapping(address => uint256)) public ghostPaidPair;
    mapping(address => mapping(address => uint256)) public ghostOwed;
    /// Pending withdrawal as the handler requested it, and when (0: none).
    mapping(address => uint256) public ghostPendingAmount;
    mapping(address => uint256) public ghostRequestedAt;
    /// Whether the honest operator's drafters already redeemed for its current request.
    bool internal diligentDone;
    /// Must stay 0: a call whose outcome differed from the oracle's (a valid call refused, an
    /// invalid one accepted, another amount or another error); a paid amount that shrank; a
    /// diligent drafter paid less than its newest voucher's increment.
    uint256 public ghostUnexpected;
    uint256 public ghostPaidDecreased;
    uint256 public ghostDiligentShortchanged;
    /// How often the interesting paths ran, for the coverage test.
    uint256 public redemptions;
    uint256 public partialRedemptions;
    uint256 public diligentRedemptions;
    uint256 public emptyRejected;
    uint256 public notNewerRejected;
    uint256 public badVouchersRejected;
    uint256 public withdrawals;
    uint256 public cutWithdrawals; // paid less than requested: redemptions took the rest
    uint256 public notReadyRejected;
    uint256 public cancellations;
    uint256 public replacedRequests;

    constructor(DrafterEscrow escrow_) {
        escrow = escrow_;
        redeemWindow = escrow_.REDEEM_WINDOW();
        for (uint256 i; i < 3; ++i) {
            opPks.push(0xE000 + i);
            operators.push(vm.addr(0xE000 + i));
            drafters.push(address(uint160(0xD000 + i)));
        }
    }

    // ---- views for the invariants ----------------------------------------------------------

    function operatorCount() external view returns (uint256) {
        return operators.length;
    }

    function drafterCount() external view returns (uint256) {
        return drafters.length;
    }

    function honestOperator() external view returns (address) {
        return operators[HONEST];
    }

    /// What `op` signed and its drafters have not been paid yet, summed over its drafters.
    function unredeemed(address op) public view returns (uint256 sum) {
        for (uint256 d; d < drafters.length; ++d) {
            sum += latestSigned[op][drafters[d]] - escrow.paid(op, drafters[d]);
        }
    }

    // ---- helpers ---------------------------------------------------------------------------

    function _min(uint256 a, uint256 b) internal pure returns (uint256) {
        return a < b ? a : b;
    }

    /// Counts a call whose revert data differs from `expected` (empty: the call had to succeed).
    function _checkRevert(bytes memory err, bytes memory expected) internal {
        if (keccak256(err) != keccak256(expected) || expected.length == 0) ++ghostUnexpected;
    }

    function _voucherOf(address op, address dr, bool previous) internal view returns (DrafterEscrow.Voucher memory) {
        return previous
            ? DrafterEscrow.Voucher(op, dr, prevSigned[op][dr], prevIssuedAt[op][dr])
            : DrafterEscrow.Voucher(op, dr, latestSigned[op][dr], latestIssuedAt[op][dr]);
    }

    // ---- actions ---------------------------------------------------------------------------

    function deposit(uint256 opSeed, uint256 amount) external {
        address op = operators[opSeed % operators.length];
        amount = bound(amount, 0, 5 ether);
        vm.deal(op, amount);
        uint256 before = escrow.balanceOf(op);
        vm.prank(op);
        try escrow.deposit{value: amount}() {
            if (amount == 0 || escrow.balanceOf(op) != before + amount) ++ghostUnexpected;
            ghostDeposited += amount;
        } catch (bytes memory err) {
            _checkRevert(err, amount == 0 ? abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector) : bytes(""));
        }
    }

    /// One call in eight names the zero address.
    function depositFor(uint256 opSeed, uint256 amount) external {
        address op = (opSeed >> 128) % 8 == 0 ? address(0) : operators[opSeed % operators.length];
        amount = bound(amount, 1, 5 ether);
        vm.deal(DEPOSITOR, amount);
        vm.prank(DEPOSITOR);
        try escrow.depositFor{value: amount}(op) {
            if (op == address(0)) ++ghostUnexpected;
            ghostDeposited += amount;
        } catch (bytes memory err) {
            _checkRevert(err, op == address(0) ? abi.encodeWithSelector(DrafterEscrow.ZeroAddress.selector) : bytes(""));
        }
    }

    /// Operator `opSeed` signs a newer voucher for drafter `drSeed` (off-chain: no transaction).
    /// The honest operator signs only what its balance minus its pending withdrawal still covers.
    function sign(uint256 opSeed, uint256 drSeed, uint256 increment) external {
        uint256 k = opSeed % operators.length;
        address op = operators[k];
        address dr = drafters[drSeed % drafters.length];
        if (k == HONEST) {
            uint256 free = escrow.balanceOf(op);
            uint256 committed = ghostPendingAmount[op] + unredeemed(op);
            if (free <= committed) return;
            increment = bound(increment, 1, free - committed);
        } else {
            increment = bound(increment, 1, 4 ether);
        }
        (prevSigned[op][dr], prevSig[op][dr], prevIssuedAt[op][dr]) =
        (latestSigned[op][dr], latestSig[op][dr], latestIssuedAt[op][dr]);
        latestSigned[op][dr] += increment;
        latestIssuedAt[op][dr] = uint64(block.timestamp);
        latestSig[op][dr] = _signVoucher(escrow, opPks[k], _voucherOf(op, dr, false));
    }

    /// A drafter redeems its newest voucher (mode 0-4), or tries: the one before (5: a replay),
    /// someone else's newest (6: wrong caller), a forged one (7: signed by a key that isn't the
    /// operator's).
    function redeem(uint256 opSeed, uint256 drSeed, uint256 mode) external {
        address op = operators[opSeed % operators.length];
        address dr = drafters[drSeed % drafters.length];
        mode = mode % 8;
        _redeem(op, dr, mode, false);
    }

    function _redeem(address op, address dr, uint256 mode, bool diligent) internal {
        DrafterEscrow.Voucher memory v = _voucherOf(op, dr, mode == 5);
        bytes memory sig = mode == 5 ? prevSig[op][dr] : latestSig[op][dr];
        address caller = dr;
        if (mode == 6) caller = drafters[(uint160(dr) + 1) % drafters.length];
        if (mode == 7) {
            v.cumulativeWei = latestSigned[op][dr] + 1 ether;
            sig = _signVoucher(escrow, FORGER_PK, v);
        }
        if (sig.length == 0) return; // nothing signed yet

        uint256 paidBefore = escrow.paid(op, dr);
        uint256 balance = escrow.balanceOf(op);
        bytes memory expected;
        if (mode == 6) {
            expected = abi.encodeWithSelector(DrafterEscrow.NotVoucherDrafter.selector, caller, dr);
        } else if (mode == 7) {
            expected = abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, vm.addr(FORGER_PK), op);
        } else if (v.cumulativeWei <= paidBefore) {
            expected = abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, v.cumulativeWei, paidBefore);
        } else if (balance == 0) {
            expected = abi.encodeWithSelector(DrafterEscrow.EscrowEmpty.selector, op, v.cumulativeWei - paidBefore);
        }
        uint256 drafterBefore = dr.balance;
        vm.prank(caller);
        try escrow.redeem(v, sig) returns (uint256 got) {
            uint256 increment = v.cumulativeWei - paidBefore; // the call succeeded: no underflow
            if (expected.length != 0 || got != _min(increment, balance)) ++ghostUnexpected;
            if (dr.balance != drafterBefore + got || escrow.balanceOf(op) != balance - got) ++ghostUnexpected;
            if (escrow.paid(op, dr) < paidBefore) ++ghostPaidDecreased;
            if (diligent && got != increment) ++ghostDiligentShortchanged;
            ghostPaidPair[op][dr] += got;
            ghostOwed[op][dr] = increment - got;
            ghostPaid += got;
            ++redemptions;
            if (got < increment) ++partialRedemptions;
            if (diligent) ++diligentRedemptions;
        } catch (bytes memory err) {
            _checkRevert(err, expected);
            if (diligent) ++ghostDiligentShortchanged;
            if (mode < 6 && expected.length != 0) {
                if (balance == 0 && v.cumulativeWei > paidBefore) ++emptyRejected;
                else ++notNewerRejected;
            } else if (mode >= 6) {
                ++badVouchersRejected;
            }
        }
    }

    /// Asks to withdraw the whole balance (one call in two: an operator leaving, so that
    /// redemptions during the delay cut the withdrawal), or an amount up to a little above the
    /// balance (0 and too much included).
    function requestWithdrawal(uint256 opSeed, uint256 amount) external {
        address op = operators[opSeed % operators.length];
        uint256 balance = escrow.balanceOf(op);
        amount = (opSeed >> 128) % 2 == 0 ? balance : bound(amount, 0, balance + 1 ether);
        bytes memory expected;
        if (amount == 0) {
            expected = abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector);
        } else if (amount > balance) {
            expected = abi.encodeWithSelector(DrafterEscrow.AmountExceedsBalance.selector, amount, balance);
        }
        vm.prank(op);
        try escrow.requestWithdrawal(amount) {
            (uint256 pending, uint64 readyAt) = escrow.pendingWithdrawal(op);
            if (expected.length != 0 || pending != amount || readyAt != block.timestamp + escrow.withdrawalDelay()) {
                ++ghostUnexpected;
            }
            if (ghostRequestedAt[op] != 0) ++replacedRequests;
            ghostPendingAmount[op] = amount;
            ghostRequestedAt[op] = block.timestamp;
            if (op == operators[HONEST]) diligentDone = false;
        } catch (bytes memory err) {
            _checkRevert(err, expected);
        }
    }

    function cancelWithdrawal(uint256 opSeed) external {
        address op = operators[opSeed % operators.length];
        bool pending = ghostRequestedAt[op] != 0;
        vm.prank(op);
        try escrow.cancelWithdrawal() {
            if (!pending) ++ghostUnexpected;
            delete ghostPendingAmount[op];
            delete ghostRequestedAt[op];
            ++cancellations;
        } catch (bytes memory err) {
            _checkRevert(err, abi.encodeWithSelector(DrafterEscrow.NoPendingWithdrawal.selector, op));
            if (pending) ++ghostUnexpected;
        }
    }

    /// Three calls in four go to an operator whose withdrawal is ready, if there is one.
    function withdraw(uint256 opSeed) external {
        uint256 k = opSeed % operators.length;
        for (uint256 i; i < operators.length && (opSeed >> 64) % 4 != 0; ++i) {
            address candidate = operators[(k + i) % operators.length];
            uint256 t = ghostRequestedAt[candidate];
            if (t != 0 && block.timestamp >= t + escrow.withdrawalDelay()) {
                k = (k + i) % operators.length;
                break;
            }
        }
        address op = operators[k];
        uint256 requestedAt = ghostRequestedAt[op];
        uint256 readyAt = requestedAt + escrow.withdrawalDelay();
        uint256 balance = escrow.balanceOf(op);
        bytes memory expected;
        if (requestedAt == 0) {
            expected = abi.encodeWithSelector(DrafterEscrow.NoPendingWithdrawal.selector, op);
        } else if (block.timestamp < readyAt) {
            expected = abi.encodeWithSelector(
                DrafterEscrow.WithdrawalNotReady.selector, uint64(readyAt), uint64(block.timestamp)
            );
        }
        uint256 opBefore = op.balance;
        vm.prank(op);
        try escrow.withdraw() returns (uint256 out) {
            if (expected.length != 0 || out != _min(ghostPendingAmount[op], balance)) ++ghostUnexpected;
            if (op.balance != opBefore + out || escrow.balanceOf(op) != balance - out) ++ghostUnexpected;
            if (out < ghostPendingAmount[op]) ++cutWithdrawals;
            ghostWithdrawn += out;
            delete ghostPendingAmount[op];
            delete ghostRequestedAt[op];
            ++withdrawals;
        } catch (bytes memory err) {
            _checkRevert(err, expected);
            if (requestedAt != 0) ++notReadyRejected;
        }
    }

    /// Moves time on by 1/8 to 1/2 of the withdrawal delay; one warp in four lands exactly on the
    /// next deadline (a redeem window's end, or a readyAt), or one second past it. Before time
    /// passes the end of the honest operator's redeem window, its drafters redeem (diligence).
    function warp(uint256 dt) external {
        uint256 to = block.timestamp + (1 + dt % 4) * (escrow.withdrawalDelay() / 8);
        if ((dt >> 8) % 4 == 0) {
            uint256 next = _nextDeadline();
            if (next != 0) to = next + (dt >> 16) % 2;
        }
        address honest = operators[HONEST];
        uint256 requestedAt = ghostRequestedAt[honest];
        if (requestedAt != 0 && !diligentDone && to > requestedAt + redeemWindow) {
            for (uint256 d; d < drafters.length; ++d) {
                if (latestSigned[honest][drafters[d]] > escrow.paid(honest, drafters[d])) {
                    _redeem(honest, drafters[d], 0, true);
                }
            }
            diligentDone = true;
        }
        vm.warp(to);
    }

    /// The earliest deadline still ahead (0 if none): a pending request's redeem-window end or readyAt.
    function _nextDeadline() internal view returns (uint256 next) {
        for (uint256 i; i < operators.length; ++i) {
            uint256 t = ghostRequestedAt[operators[i]];
            if (t == 0) continue;
            uint256 windowEnd = t + redeemWindow;
            uint256 readyAt = t + escrow.withdrawalDelay();
            if (windowEnd > block.timestamp && (next == 0 || windowEnd < next)) next = windowEnd;
            if (readyAt > block.timestamp && (next == 0 || readyAt < next)) next = readyAt;
        }
    }
}
