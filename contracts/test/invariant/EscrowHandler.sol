// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowHelpers} from "../utils/EscrowFixture.sol";
import {DrafterEscrow} from "../../src/DrafterEscrow.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @dev Drives DrafterEscrow v2 through random sequences of deposits, withdrawals, lane funding
///      (from the pool, with ETH, both), voucher signing, redemptions (good ones and bad ones:
///      replays, wrong callers, forged signatures, vouchers moved to another lane), operators'
///      vouchers to themselves, thaw requests, cancellations, thaws and time warps, with real
///      operator signatures. Every call's outcome is checked against the handler's own oracle
///      (success and amounts, or the exact revert), and per-lane ghost accounting backs the
///      invariants.
///
///      Three operators (`vm.addr` keys) x four payees (three drafters, and the operator itself:
///      its self-lanes) x two lane ids = 24 lanes, indexed `(op * 4 + payee) * 2 + id`.
///
///      Operator 0 is honest and its drafters diligent, the model the lane guarantee is built for:
///      on a drafter lane it signs only what `balance - thawing - unredeemed` still covers, and its
///      drafters redeem their newest vouchers within REDEEM_WINDOW of each `ThawRequested` on
///      their lane (just before a warp would carry time past that). Operators 1 and 2 sign
///      whatever they like (more than their lanes hold, so vouchers get paid in part) and their
///      drafters redeem whenever.
contract EscrowHandler is EscrowHelpers {
    DrafterEscrow public immutable escrow;
    uint256 public immutable redeemWindow;
    uint256 public immutable period;
    address internal immutable forger;

    uint256 public constant N_OPS = 3;
    uint256 public constant N_PAYEES = 4; // three drafters, then the operator itself
    uint256 public constant N_IDS = 2;
    uint256 public constant N_LANES = N_OPS * N_PAYEES * N_IDS;
    uint256 internal constant HONEST = 0; // index of the honest operator
    uint256 internal constant FORGER_PK = 0xF0F0;
    address internal constant DEPOSITOR = address(0xDE90);

    uint256[] internal opPks;
    address[] public operators;
    address[] public drafters;
    uint64[2] internal laneIds = [uint64(0), uint64(7)];

    /// Per lane: the handler's bookkeeping and the vouchers signed for it.
    struct Ghost {
        uint256 funded; // everything fundLane put in
        uint256 redeemed; // everything redemptions paid out of it (to its drafter)
        uint256 thawed; // everything thaws moved out of it at or after readyAt
        uint256 maxSigned; // the largest cumulativeWei signed for it
        uint256 owed; // what the last successful redemption left unpaid of its voucher
        uint256 latest;
        uint64 latestIssuedAt;
        bytes latestSig;
        uint256 prev;
        uint64 prevIssuedAt;
        bytes prevSig;
        uint256 thawAmount; // pending thaw as requested
        uint256 requestedAt; // 0: none
        bool diligentDone; // the honest operator's drafter redeemed for the current request
    }

    mapping(uint256 => Ghost) internal g;

    // ---- ghost state ----------------------------------------------------------------------
    uint256 public ghostDeposited; // all ETH that entered: deposit, depositFor, fundLane's value
    uint256 public ghostWithdrawn;
    uint256 public ghostPaid;
    mapping(address => uint256) public ghostPool;
    /// Must stay 0: a call whose outcome differed from the oracle's; a thaw that moved money
    /// before its readyAt; a replay that paid; a diligent drafter paid less than its increment; a
    /// self-voucher that moved another lane.
    uint256 public ghostUnexpected;
    uint256 public ghostEarlyThaw;
    uint256 public ghostReplayPaid;
    uint256 public ghostDiligentShortchanged;
    uint256 public ghostSelfVoucherLeak;
    /// How often the interesting paths ran, for the coverage test.
    uint256 public redemptions;
    uint256 public partialRedemptions;
    uint256 public diligentRedemptions;
    uint256 public emptyRejected;
    uint256 public replaysRejected;
    uint256 public badVouchersRejected;
    uint256 public laneMovedRejected;
    uint256 public selfVouchers;
    uint256 public selfVouchersPaid;
    uint256 public withdrawals;
    uint256 public withdrawalsRejected;
    uint256 public fundedFromPool;
    uint256 public fundedWithValue;
    uint256 public fundedBoth;
    uint256 public fundingRejected;
    uint256 public thaws;
    uint256 public cutThaws; // moved less than requested: redemptions took the rest
    uint256 public notReadyRejected;
    uint256 public cancellations;
    uint256 public replacedRequests;

    constructor(DrafterEscrow escrow_) {
        escrow = escrow_;
        redeemWindow = escrow_.REDEEM_WINDOW();
        period = escrow_.thawingPeriod();
        forger = vm.addr(FORGER_PK);
        for (uint256 i; i < N_OPS; ++i) {
            opPks.push(0xE000 + i);
            operators.push(vm.addr(0xE000 + i));
            drafters.push(address(uint160(0xD000 + i)));
        }
    }

    // ---- views for the invariants ----------------------------------------------------------

    /// Lane `i`: (operator, drafter, lane id).
    function laneAt(uint256 i) public view returns (address op, address dr, uint64 id) {
        uint256 p = (i / N_IDS) % N_PAYEES;
        op = operators[i / (N_IDS * N_PAYEES)];
        dr = p < drafters.length ? drafters[p] : op;
        id = laneIds[i % N_IDS];
    }

    /// Whether lane `i` belongs to a drafter (not an operator's self-lane).
    function isDrafterLane(uint256 i) public pure returns (bool) {
        return (i / N_IDS) % N_PAYEES < N_PAYEES - 1;
    }

    function isHonestLane(uint256 i) public pure returns (bool) {
        return i / (N_IDS * N_PAYEES) == HONEST && isDrafterLane(i);
    }

    /// One lane as the invariants see it: where it is, and the handler's ghost values for it.
    struct Snap {
        address op;
        address dr;
        uint64 id;
        bool drafterLane;
        bool honest;
        uint256 funded;
        uint256 redeemed;
        uint256 thawed;
        uint256 maxSigned;
        uint256 latest;
        uint256 owed;
    }

    /// Every lane's Snap, in index order (one call: the invariants run after every handler call).
    function snapshot() external view returns (Snap[] memory snaps) {
        snaps = new Snap[](N_LANES);
        for (uint256 i; i < N_LANES; ++i) {
            Snap memory x = snaps[i];
            (x.op, x.dr, x.id) = laneAt(i);
            (x.drafterLane, x.honest) = (isDrafterLane(i), isHonestLane(i));
            Ghost storage y = g[i];
            (x.funded, x.redeemed, x.thawed) = (y.funded, y.redeemed, y.thawed);
            (x.maxSigned, x.latest, x.owed) = (y.maxSigned, y.latest, y.owed);
        }
    }

    // ---- helpers ---------------------------------------------------------------------------

    function _min(uint256 a, uint256 b) internal pure returns (uint256) {
        return a < b ? a : b;
    }

    function _lane(uint256 i) internal view returns (LaneState memory) {
        (address op, address dr, uint64 id) = laneAt(i);
        return _laneOf(escrow, op, dr, id);
    }

    /// Counts a call whose revert data differs from `expected` (empty: the call had to succeed).
    function _checkRevert(bytes memory err, bytes memory expected) internal {
        if (keccak256(err) != keccak256(expected) || expected.length == 0) ++ghostUnexpected;
    }

    function _voucherOf(uint256 i, bool previous) internal view returns (DrafterEscrow.Voucher memory) {
        (address op, address dr, uint64 id) = laneAt(i);
        Ghost storage x = g[i];
        return previous
            ? DrafterEscrow.Voucher(op, dr, id, x.prev, x.prevIssuedAt)
            : DrafterEscrow.Voucher(op, dr, id, x.latest, x.latestIssuedAt);
    }

    /// A die with `sides` sides, rolled from the call's arguments: forge's fuzzer favours small
    /// and edge values, so the rare branches are picked from a hash, never from raw high bits.
    function _roll(uint256 a, uint256 b, uint256 sides) internal pure returns (uint256) {
        return uint256(keccak256(abi.encode(a, b))) % sides;
    }

    /// Lane `laneSeed` of operator `opSeed`.
    function _pick(uint256 opSeed, uint256 laneSeed) internal pure returns (uint256) {
        return (opSeed % N_OPS) * N_PAYEES * N_IDS + laneSeed % (N_PAYEES * N_IDS);
    }

    /// Three calls in four move from lane `i` to the next lane (in index order, wrapping) for
    /// which `wanted` holds, if any: random lane picks rarely meet the lanes where something
    /// happened (24 lanes, 32 calls a run).
    function _prefer(uint256 i, uint256 seed, function(uint256) internal view returns (bool) wanted)
        internal
        view
        returns (uint256)
    {
        if (_roll(seed, i, 4) == 0) return i;
        for (uint256 n; n < N_LANES; ++n) {
            uint256 c = (i + n) % N_LANES;
            if (wanted(c)) return c;
        }
        return i;
    }

    /// From the ghost books (invariant 1 keeps them equal to the lane's balance): no call.
    function _isFunded(uint256 i) internal view returns (bool) {
        Ghost storage x = g[i];
        return x.funded != x.redeemed + x.thawed;
    }

    function _hasVoucher(uint256 i) internal view returns (bool) {
        return g[i].latest != 0;
    }

    function _isThawing(uint256 i) internal view returns (bool) {
        return g[i].requestedAt != 0;
    }

    /// Records a newer voucher `cumulativeWei` for lane `i`, signed by its operator.
    function _record(uint256 i, uint256 cumulativeWei) internal {
        Ghost storage x = g[i];
        (x.prev, x.prevIssuedAt, x.prevSig) = (x.latest, x.latestIssuedAt, x.latestSig);
        x.latest = cumulativeWei;
        x.latestIssuedAt = uint64(block.timestamp);
        x.latestSig = _signVoucher(escrow, opPks[i / (N_IDS * N_PAYEES)], _voucherOf(i, false));
        if (cumulativeWei > x.maxSigned) x.maxSigned = cumulativeWei;
    }

    // ---- pools ----------------------------------------------------------------------------

    function deposit(uint256 opSeed, uint256 amount) external {
        address op = operators[opSeed % N_OPS];
        amount = bound(amount, 0, 5 ether);
        vm.deal(op, amount);
        vm.prank(op);
        try escrow.deposit{value: amount}() {
            if (amount == 0) ++ghostUnexpected;
            ghostDeposited += amount;
            ghostPool[op] += amount;
            if (escrow.poolOf(op) != ghostPool[op]) ++ghostUnexpected;
        } catch (bytes memory err) {
            _checkRevert(err, amount == 0 ? abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector) : bytes(""));
        }
    }

    /// One call in eight names the zero address.
    function depositFor(uint256 opSeed, uint256 amount) external {
        address op = _roll(opSeed, amount, 8) == 0 ? address(0) : operators[opSeed % N_OPS];
        amount = bound(amount, 1, 5 ether);
        vm.deal(DEPOSITOR, amount);
        vm.prank(DEPOSITOR);
        try escrow.depositFor{value: amount}(op) {
            if (op == address(0)) ++ghostUnexpected;
            ghostDeposited += amount;
            ghostPool[op] += amount;
        } catch (bytes memory err) {
            _checkRevert(err, op == address(0) ? abi.encodeWithSelector(DrafterEscrow.ZeroAddress.selector) : bytes(""));
        }
    }

    /// Withdraws the whole pool (one call in two), or an amount up to a little above it (0 and
    /// too much included).
    function withdraw(uint256 opSeed, uint256 amount) external {
        address op = operators[opSeed % N_OPS];
        uint256 pool = ghostPool[op];
        amount = _roll(opSeed, amount, 2) == 0 ? pool : bound(amount, 0, pool + 1 ether);
        bytes memory expected;
        if (amount == 0) {
            expected = abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector);
        } else if (amount > pool) {
            expected = abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, amount, pool);
        }
        uint256 before = op.balance;
        vm.prank(op);
        try escrow.withdraw(amount) returns (uint256 out) {
            if (expected.length != 0 || out != amount || op.balance != before + amount) ++ghostUnexpected;
            ghostPool[op] -= amount;
            ghostWithdrawn += amount;
            ++withdrawals;
        } catch (bytes memory err) {
            _checkRevert(err, expected);
            ++withdrawalsRejected;
        }
    }

    // ---- lanes ----------------------------------------------------------------------------

    /// Funds a lane from the pool (source 0), with ETH (1) or both (2); one call in sixteen
    /// names the zero drafter, one in eight asks for more of the pool than there is, one in
    /// sixteen for nothing at all.
    function fundLane(uint256 opSeed, uint256 laneSeed, uint256 amount) external {
        uint256 i = _pick(opSeed, laneSeed);
        (address op, address dr, uint64 id) = laneAt(i);
        uint256 r = uint256(keccak256(abi.encode(opSeed, laneSeed, amount)));
        if (r % 16 == 0) dr = address(0);
        uint256 source = (r >> 8) % 3;
        uint256 pool = ghostPool[op];
        uint256 value = source == 0 ? 0 : bound(amount, 0, 4 ether);
        uint256 fromPool = source == 1 ? 0 : bound(amount >> 64, 0, pool);
        if ((r >> 16) % 8 == 0) fromPool = pool + 1 + (r >> 32) % 1 ether;
        if ((r >> 24) % 16 == 0) (value, fromPool) = (0, 0);
        bytes memory expected;
        if (dr == address(0)) {
            expected = abi.encodeWithSelector(DrafterEscrow.ZeroAddress.selector);
        } else if (value == 0 && fromPool == 0) {
            expected = abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector);
        } else if (fromPool > pool) {
            expected = abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, fromPool, pool);
        }
        uint256 balanceBefore = _lane(i).balance;
        vm.deal(op, value);
        vm.prank(op);
        try escrow.fundLane{value: value}(dr, id, fromPool) {
            if (expected.length != 0 || _lane(i).balance != balanceBefore + value + fromPool) ++ghostUnexpected;
            ghostPool[op] -= fromPool;
            if (escrow.poolOf(op) != ghostPool[op]) ++ghostUnexpected;
            ghostDeposited += value;
            g[i].funded += value + fromPool;
            if (value == 0) ++fundedFromPool;
            else if (fromPool == 0) ++fundedWithValue;
            else ++fundedBoth;
        } catch (bytes memory err) {
            _checkRevert(err, expected);
            ++fundingRejected;
        }
    }

    /// The operator of lane `laneSeed` signs a newer voucher for it (off-chain: no transaction).
    /// The honest operator signs only what `balance - thawing - unredeemed` still covers.
    function sign(uint256 opSeed, uint256 laneSeed, uint256 increment) external {
        uint256 i = _prefer(_pick(opSeed, laneSeed), increment, _isFunded);
        if (isHonestLane(i)) {
            LaneState memory s = _lane(i);
            uint256 committed = s.thawing + (g[i].latest - s.paid);
            if (s.balance <= committed) return;
            increment = bound(increment, 1, s.balance - committed);
        } else {
            increment = bound(increment, 1, 4 ether);
        }
        _record(i, g[i].latest + increment);
    }

    /// A payee redeems its lane's newest voucher (mode 0-3), or tries: the one before (4: a
    /// replay), someone else's (5: wrong caller), a forged one (6: signed by a key that isn't the
    /// operator's), the newest voucher of its other lane id moved onto this one (7).
    function redeem(uint256 opSeed, uint256 laneSeed, uint256 mode) external {
        _redeem(_prefer(_pick(opSeed, laneSeed), mode, _hasVoucher), mode % 8, false);
    }

    function _redeem(uint256 i, uint256 mode, bool diligent) internal {
        (, address dr,) = laneAt(i);
        DrafterEscrow.Voucher memory v = _voucherOf(i, mode == 4);
        bytes memory sig = mode == 4 ? g[i].prevSig : g[i].latestSig;
        address caller = dr;
        if (mode == 5) caller = dr == drafters[0] ? drafters[1] : drafters[0];
        if (mode == 6) {
            v.cumulativeWei = g[i].latest + 1 ether;
            sig = _signVoucher(escrow, FORGER_PK, v);
        }
        if (mode == 7) {
            uint256 j = i % N_IDS == 0 ? i + 1 : i - 1; // the same payee's other lane id
            DrafterEscrow.Voucher memory w = _voucherOf(j, false);
            (v.cumulativeWei, v.issuedAt, sig) = (w.cumulativeWei, w.issuedAt, g[j].latestSig);
        }
        if (sig.length == 0) return; // nothing signed yet
        bytes memory expected = _expectedRedeem(i, v, sig, caller, mode);
        _tryRedeem(i, v, sig, caller, expected, mode, diligent);
    }

    function _expectedRedeem(uint256 i, DrafterEscrow.Voucher memory v, bytes memory sig, address caller, uint256 mode)
        internal
        view
        returns (bytes memory)
    {
        LaneState memory s = _lane(i);
        if (caller != v.drafter) {
            return abi.encodeWithSelector(DrafterEscrow.NotVoucherDrafter.selector, caller, v.drafter);
        }
        if (mode == 6) return abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, forger, v.operator);
        if (mode == 7) {
            address recovered = _recover(escrow.voucherDigest(v), sig);
            if (recovered == address(0)) return abi.encodeWithSelector(ECDSA.ECDSAInvalidSignature.selector);
            return abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, v.operator);
        }
        if (v.cumulativeWei <= s.paid) {
            return abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, v.cumulativeWei, s.paid);
        }
        if (s.balance == 0) {
            return abi.encodeWithSelector(
                DrafterEscrow.LaneEmpty.selector, v.operator, v.drafter, v.lane, v.cumulativeWei - s.paid
            );
        }
        return "";
    }

    function _tryRedeem(
        uint256 i,
        DrafterEscrow.Voucher memory v,
        bytes memory sig,
        address caller,
        bytes memory expected,
        uint256 mode,
        bool diligent
    ) internal {
        LaneState memory before = _lane(i);
        uint256 payeeBefore = v.drafter.balance;
        vm.prank(caller);
        try escrow.redeem(v, sig) returns (uint256 got) {
            uint256 increment = v.cumulativeWei - before.paid; // the call succeeded: no underflow
            if (expected.length != 0 || got != _min(increment, before.balance)) ++ghostUnexpected;
            if (v.drafter.balance != payeeBefore + got || _lane(i).balance != before.balance - got) {
                ++ghostUnexpected;
            }
            if (v.cumulativeWei <= before.paid) ++ghostReplayPaid; // no newer than paid, yet it paid
            if (diligent && got != increment) ++ghostDiligentShortchanged;
            g[i].redeemed += got;
            g[i].owed = increment - got;
            ghostPaid += got;
            ++redemptions;
            if (got < increment) ++partialRedemptions;
            if (diligent) ++diligentRedemptions;
        } catch (bytes memory err) {
            _checkRevert(err, expected);
            if (diligent) ++ghostDiligentShortchanged;
            if (mode >= 5) {
                ++badVouchersRejected;
                if (mode == 7) ++laneMovedRejected;
            } else if (v.cumulativeWei <= before.paid) {
                ++replaysRejected;
            } else {
                ++emptyRejected;
            }
        }
    }

    /// The attack v1 allowed: an operator signs a huge voucher to itself, on either lane id, and
    /// redeems it at once. It pays only from its own self-lane; no drafter lane moves.
    function selfVoucher(uint256 opSeed, uint256 idSeed, uint256 amount) external {
        uint256 k = opSeed % N_OPS;
        uint256 i = (k * N_PAYEES + N_PAYEES - 1) * N_IDS + idSeed % N_IDS; // (op, op, id)
        _record(i, g[i].latest + bound(amount, 1, 1_000 ether));
        bytes32 drafterLanes = _drafterLanesHash(k);
        ++selfVouchers;
        uint256 paidBefore = g[i].redeemed;
        _redeem(i, 0, false);
        if (g[i].redeemed > paidBefore) ++selfVouchersPaid;
        if (_drafterLanesHash(k) != drafterLanes) ++ghostSelfVoucherLeak;
    }

    function _drafterLanesHash(uint256 k) internal view returns (bytes32 h) {
        for (uint256 i = k * N_PAYEES * N_IDS; i < (k + 1) * N_PAYEES * N_IDS; ++i) {
            if (isDrafterLane(i)) h = keccak256(abi.encode(h, _lane(i)));
        }
    }

    // ---- thaws ----------------------------------------------------------------------------

    /// Asks to thaw the whole lane (one call in two: an operator leaving, so that redemptions
    /// during the period cut the thaw), or an amount up to a little above the balance (0 and too
    /// much included).
    function requestThaw(uint256 opSeed, uint256 laneSeed, uint256 amount) external {
        uint256 i = _prefer(_pick(opSeed, laneSeed), amount, _isFunded);
        (address op, address dr, uint64 id) = laneAt(i);
        uint256 balance = _lane(i).balance;
        amount = _roll(opSeed, amount, 2) == 0 ? balance : bound(amount, 0, balance + 1 ether);
        bytes memory expected;
        if (amount == 0) {
            expected = abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector);
        } else if (amount > balance) {
            expected = abi.encodeWithSelector(DrafterEscrow.AmountExceedsLane.selector, amount, balance);
        }
        vm.prank(op);
        try escrow.requestThaw(dr, id, amount) {
            LaneState memory s = _lane(i);
            if (expected.length != 0 || s.thawing != amount || s.readyAt != block.timestamp + period) {
                ++ghostUnexpected;
            }
            if (g[i].requestedAt != 0) ++replacedRequests;
            (g[i].thawAmount, g[i].requestedAt, g[i].diligentDone) = (amount, block.timestamp, false);
        } catch (bytes memory err) {
            _checkRevert(err, expected);
        }
    }

    function cancelThaw(uint256 opSeed, uint256 laneSeed) external {
        uint256 i = _prefer(_pick(opSeed, laneSeed), opSeed ^ laneSeed, _isThawing);
        (address op, address dr, uint64 id) = laneAt(i);
        bool pending = g[i].requestedAt != 0;
        vm.prank(op);
        try escrow.cancelThaw(dr, id) {
            LaneState memory later = _lane(i);
            if (!pending || later.thawing != 0 || later.readyAt != 0) ++ghostUnexpected;
            (g[i].thawAmount, g[i].requestedAt) = (0, 0);
            ++cancellations;
        } catch (bytes memory err) {
            _checkRevert(err, abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, op, dr, id));
            if (pending) ++ghostUnexpected;
        }
    }

    /// Three calls in four go to a lane whose thaw is ready, if there is one.
    function thaw(uint256 opSeed, uint256 laneSeed) external {
        uint256 i = _pick(opSeed, laneSeed);
        for (uint256 n; n < N_LANES && _roll(opSeed, laneSeed, 4) != 0; ++n) {
            uint256 c = (i + n) % N_LANES;
            uint256 t = g[c].requestedAt;
            if (t != 0 && block.timestamp >= t + period) {
                i = c;
                break;
            }
        }
        (address op, address dr, uint64 id) = laneAt(i);
        Ghost storage x = g[i];
        bytes memory expected;
        if (x.requestedAt == 0) {
            expected = abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, op, dr, id);
        } else if (block.timestamp < x.requestedAt + period) {
            expected = abi.encodeWithSelector(
                DrafterEscrow.ThawNotReady.selector, uint64(x.requestedAt + period), uint64(block.timestamp)
            );
        }
        uint256 balance = _lane(i).balance;
        vm.prank(op);
        try escrow.thaw(dr, id) returns (uint256 out) {
            if (expected.length != 0 || out != _min(x.thawAmount, balance)) ++ghostUnexpected;
            LaneState memory later = _lane(i);
            if (later.balance != balance - out || later.thawing != 0 || later.readyAt != 0) ++ghostUnexpected;
            // only a thaw from readyAt on counts as a legitimate way out of the lane
            if (x.requestedAt != 0 && block.timestamp >= x.requestedAt + period) x.thawed += out;
            else ++ghostEarlyThaw;
            if (out < x.thawAmount) ++cutThaws;
            ghostPool[op] += out;
            if (escrow.poolOf(op) != ghostPool[op]) ++ghostUnexpected;
            (x.thawAmount, x.requestedAt) = (0, 0);
            ++thaws;
        } catch (bytes memory err) {
            _checkRevert(err, expected);
            if (x.requestedAt != 0) ++notReadyRejected;
        }
    }

    // ---- time -----------------------------------------------------------------------------

    /// Moves time on by 1/8 to 1/2 of the thawing period; one warp in four lands exactly on the
    /// next deadline (a redeem window's end, or a readyAt), or one second past it. Before time
    /// passes the end of a redeem window on one of the honest operator's lanes, its drafter
    /// redeems its newest voucher there (diligence).
    function warp(uint256 dt) external {
        uint256 to = block.timestamp + (1 + dt % 4) * (period / 8);
        uint256 r = _roll(dt, block.timestamp, 8);
        if (r < 2) {
            uint256 next = _nextDeadline();
            if (next != 0) to = next + r;
        }
        for (uint256 i; i < N_LANES; ++i) {
            Ghost storage x = g[i];
            if (!isHonestLane(i) || x.requestedAt == 0 || x.diligentDone) continue;
            if (to <= x.requestedAt + redeemWindow) continue;
            if (x.latest > _lane(i).paid) _redeem(i, 0, true);
            x.diligentDone = true;
        }
        vm.warp(to);
    }

    /// The earliest deadline still ahead (0 if none): a pending request's redeem-window end or readyAt.
    function _nextDeadline() internal view returns (uint256 next) {
        for (uint256 i; i < N_LANES; ++i) {
            uint256 t = g[i].requestedAt;
            if (t == 0) continue;
            uint256 windowEnd = t + redeemWindow;
            uint256 readyAt = t + period;
            if (windowEnd > block.timestamp && (next == 0 || windowEnd < next)) next = windowEnd;
            if (readyAt > block.timestamp && (next == 0 || readyAt < next)) next = readyAt;
        }
    }
}
