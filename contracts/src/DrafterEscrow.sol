// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

/// @title DrafterEscrow (v2: lanes)
/// @notice Escrow from which a target operator pays its untrusted drafter peers with signed,
///         cumulative vouchers, each drafter from its own lane.
///
/// Money sits in two places. An operator's **pool** is promised to nobody: deposits land there
/// and the operator withdraws from it at once. A **lane** `(operator, drafter, laneId)` holds
/// what the operator promised that drafter: the operator moves money into it (`fundLane`, from
/// its pool or with fresh ETH), and it leaves only (a) to that drafter, by redeeming that
/// operator's vouchers for that lane, or (b) back to the operator's pool through a thaw:
/// `requestThaw`, then, `thawingPeriod` (> REDEEM_WINDOW) later, `thaw`, which takes at most
/// what redemptions left. As in The Graph Horizon's escrow (one account per payer and receiver,
/// thawing before the payer takes money back) and Filecoin payment-channel lanes (each lane its
/// own redeemed amount).
///
/// Vouchers are cumulative per lane: each states the total the operator owes the drafter on
/// that lane so far (`cumulativeWei`) and supersedes the last, so paying costs no transaction.
/// The drafter redeems whenever it likes and is paid the increment over what that lane paid it
/// before: an older or equal voucher pays nothing (`VoucherNotNewer`), so replays are harmless.
///
/// Partial payment (a choice, as in v1): a voucher larger than its lane pays what is there and
/// records the rest as owed (`Owed` event, `owed` in `lane(...)`); the same voucher can be
/// redeemed again after the lane is topped up and pays the rest.
///
/// The guarantee: a drafter that, before each job, checks `balance - thawing >= its unredeemed
/// vouchers + one job's pay` on its lane, and redeems within REDEEM_WINDOW of any `ThawRequested`
/// on its lane, loses at most one job's pay. Why: only that drafter's redemptions and a thaw
/// whose `readyAt` has come take money from the lane; a thaw request (or a new one, which
/// restarts the clock) leaves at least `thawingPeriod >= 2 * REDEEM_WINDOW` to redeem; and a thaw
/// never takes what the drafter redeemed meanwhile. No voucher of another drafter, of another
/// lane, nor the operator's voucher to itself can touch the lane: a voucher pays only from
/// `(v.operator, v.drafter, v.lane)` and only to `v.drafter`, who must send the transaction.
/// Not covered: an operator that never signs for work done (the drafter's job in flight), vouchers
/// signed beyond the lane balance (owed, not enforceable), and a drafter that misses its window.
///
/// `issuedAt` is informational (off-chain freshness checks) and never checked here.
///
/// No owner, no admin: the contract holds only pools and lanes, and touches no bond or challenge
/// of SpecmarketBond. Every payment is pulled by its payee (`redeem` by the drafter, `withdraw`
/// by the operator), after its state changes (checks-effects-interactions, `nonReentrant`).
///
/// @dev Hashing, for off-chain code (also in contracts/README.md): vouchers are EIP-712 typed data
///      (primary type `Voucher`) in the domain ("SpecmarketDrafterEscrow", "2", chainid,
///      address(this)), with
///      `Voucher(address operator,address drafter,uint64 lane,uint256 cumulativeWei,uint64 issuedAt)`.
///      Signatures are 65 bytes `r || s || v` with low s (high-s twins are refused).
contract DrafterEscrow is EIP712("SpecmarketDrafterEscrow", "2"), ReentrancyGuard {
    /*//////////////////////////////////////////////////////////////
                                 TYPES
    //////////////////////////////////////////////////////////////*/

    /// @notice An operator's signed statement that it owes `drafter` `cumulativeWei` in total on
    ///         lane `lane`.
    struct Voucher {
        address operator;
        address drafter;
        uint64 lane;
        uint256 cumulativeWei;
        uint64 issuedAt;
    }

    /// @dev One lane: four slots. `thawing` and `thawReadyAt` share one (no lane comes near
    ///      2**192 wei); `thawReadyAt == 0`: no thaw pending.
    struct Lane {
        uint256 balance;
        uint256 paid;
        uint256 owed;
        uint192 thawing;
        uint64 thawReadyAt;
    }

    /*//////////////////////////////////////////////////////////////
                               CONSTANTS
    //////////////////////////////////////////////////////////////*/

    /// @notice EIP-712 type hash of `Voucher`.
    bytes32 public constant VOUCHER_TYPEHASH =
        keccak256("Voucher(address operator,address drafter,uint64 lane,uint256 cumulativeWei,uint64 issuedAt)");

    /// @notice Drafters redeem within this long of a `ThawRequested` event on their lane to be
    ///         paid for every voucher the lane covers.
    uint256 public constant REDEEM_WINDOW = 1 hours;

    /// @notice Least `thawingPeriod`: twice the redeem window, so a drafter that redeems late in
    ///         its window still has an hour of margin (block inclusion, congestion).
    uint256 public constant MIN_THAWING_PERIOD = 2 * REDEEM_WINDOW;

    /// @notice Longest `thawingPeriod`, so no configuration locks a lane for good (and
    ///         `thawReadyAt` always fits uint64).
    uint256 public constant MAX_THAWING_PERIOD = 365 days;

    /// @notice Seconds from `requestThaw` to the earliest `thaw`.
    uint256 public immutable thawingPeriod;

    /*//////////////////////////////////////////////////////////////
                                 STATE
    //////////////////////////////////////////////////////////////*/

    /// @dev Each operator's unpledged pool.
    mapping(address operator => uint256) internal _pools;
    /// @dev Lane (operator, drafter, laneId).
    mapping(address operator => mapping(address drafter => mapping(uint64 laneId => Lane))) internal _lanes;

    /*//////////////////////////////////////////////////////////////
                             EVENTS, ERRORS
    //////////////////////////////////////////////////////////////*/

    /// @notice `from` added `amount` to `operator`'s pool, which now holds `pool`.
    event Deposited(address indexed operator, address indexed from, uint256 amount, uint256 pool);
    /// @notice `operator` took `amount` out of its pool, which now holds `pool`.
    event Withdrawn(address indexed operator, uint256 amount, uint256 pool);
    /// @notice The lane got `amount` (msg.value plus what left the operator's pool: the pool
    ///         shrank by `amount - msg.value`) and now holds `balance`.
    event LaneFunded(
        address indexed operator, address indexed drafter, uint64 indexed lane, uint256 amount, uint256 balance
    );
    /// @notice Drafters should redeem within REDEEM_WINDOW of this event.
    event ThawRequested(
        address indexed operator, address indexed drafter, uint64 indexed lane, uint256 amount, uint64 readyAt
    );
    event ThawCancelled(address indexed operator, address indexed drafter, uint64 indexed lane, uint256 amount);
    /// @notice `amount` went from the lane back to the operator's pool.
    event Thawed(address indexed operator, address indexed drafter, uint64 indexed lane, uint256 amount);
    event Redeemed(
        address indexed operator, address indexed drafter, uint64 indexed lane, uint256 cumulativeWei, uint256 amount
    );
    /// @notice A redemption paid `shortWei` less than its voucher's increment (the lane ran out).
    event Owed(address indexed operator, address indexed drafter, uint64 indexed lane, uint256 shortWei);

    error ZeroAmount();
    error ZeroAddress();
    error ThawingPeriodTooShort(uint256 given, uint256 minimum);
    error ThawingPeriodTooLong(uint256 given, uint256 maximum);
    error AmountExceedsPool(uint256 amount, uint256 pool);
    error AmountExceedsLane(uint256 amount, uint256 balance);
    error NoPendingThaw(address operator, address drafter, uint64 lane);
    error ThawNotReady(uint64 readyAt, uint64 now_);
    error NotVoucherDrafter(address caller, address drafter);
    error BadSigner(address recovered, address operator);
    error VoucherNotNewer(uint256 cumulativeWei, uint256 paid);
    error LaneEmpty(address operator, address drafter, uint64 lane, uint256 increment);
    error TransferFailed(address to, uint256 amount);

    /*//////////////////////////////////////////////////////////////
                              CONSTRUCTOR
    //////////////////////////////////////////////////////////////*/

    /// @param thawingPeriod_ Seconds from `requestThaw` to the earliest `thaw`, in
    ///        [MIN_THAWING_PERIOD, MAX_THAWING_PERIOD].
    constructor(uint256 thawingPeriod_) {
        // INVARIANT: a drafter that redeems within REDEEM_WINDOW of a request beats the thaw.
        if (thawingPeriod_ < MIN_THAWING_PERIOD) revert ThawingPeriodTooShort(thawingPeriod_, MIN_THAWING_PERIOD);
        // INVARIANT: every requested thaw can complete.
        if (thawingPeriod_ > MAX_THAWING_PERIOD) revert ThawingPeriodTooLong(thawingPeriod_, MAX_THAWING_PERIOD);
        thawingPeriod = thawingPeriod_;
    }

    /*//////////////////////////////////////////////////////////////
                                 POOLS
    //////////////////////////////////////////////////////////////*/

    /// @notice Adds msg.value to msg.sender's pool.
    function deposit() external payable {
        _deposit(msg.sender);
    }

    /// @notice Adds msg.value to `operator`'s pool (only `operator` can ever withdraw it or
    ///         move it into a lane).
    function depositFor(address operator) external payable {
        if (operator == address(0)) revert ZeroAddress();
        _deposit(operator);
    }

    /// @notice Sends `amount` of msg.sender's pool to msg.sender, at once: the pool is promised
    ///         to nobody.
    /// @return The amount sent.
    function withdraw(uint256 amount) external nonReentrant returns (uint256) {
        if (amount == 0) revert ZeroAmount();
        uint256 pool = _pools[msg.sender];
        // INVARIANT: a withdrawal takes only the operator's own unpledged pool, never a lane.
        if (amount > pool) revert AmountExceedsPool(amount, pool);
        pool -= amount;
        _pools[msg.sender] = pool;
        emit Withdrawn(msg.sender, amount, pool);
        _send(msg.sender, amount);
        return amount;
    }

    /// @notice `operator`'s unpledged pool.
    function poolOf(address operator) external view returns (uint256) {
        return _pools[operator];
    }

    /*//////////////////////////////////////////////////////////////
                                 LANES
    //////////////////////////////////////////////////////////////*/

    /// @notice Adds msg.value plus `fromPool` (moved out of msg.sender's pool) to lane
    ///         (msg.sender, `drafter`, `laneId`).
    function fundLane(address drafter, uint64 laneId, uint256 fromPool) external payable {
        if (drafter == address(0)) revert ZeroAddress();
        if (msg.value == 0 && fromPool == 0) revert ZeroAmount();
        uint256 pool = _pools[msg.sender];
        // INVARIANT: a lane is funded only with the operator's own money.
        if (fromPool > pool) revert AmountExceedsPool(fromPool, pool);
        // fromPool <= pool <= the ETH this contract holds: the sum can't overflow
        uint256 amount = msg.value + fromPool;
        if (fromPool != 0) _pools[msg.sender] = pool - fromPool;
        Lane storage l = _lanes[msg.sender][drafter][laneId];
        uint256 balance = l.balance + amount;
        l.balance = balance;
        emit LaneFunded(msg.sender, drafter, laneId, amount, balance);
    }

    /// @notice Asks to move `amount` of lane (msg.sender, `drafter`, `laneId`) back to
    ///         msg.sender's pool from `thawingPeriod` on. Replaces any earlier request on the lane
    ///         and restarts the clock. The lane stays redeemable meanwhile.
    function requestThaw(address drafter, uint64 laneId, uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        Lane storage l = _lanes[msg.sender][drafter][laneId];
        uint256 balance = l.balance;
        if (amount > balance) revert AmountExceedsLane(amount, balance);
        // INVARIANT: nothing thaws before thawingPeriod after the (last) request.
        uint64 readyAt = SafeCast.toUint64(block.timestamp + thawingPeriod);
        // amount <= balance <= the ETH this contract holds, far below 2**192
        (l.thawing, l.thawReadyAt) = (SafeCast.toUint192(amount), readyAt);
        emit ThawRequested(msg.sender, drafter, laneId, amount, readyAt);
    }

    /// @notice Drops the pending thaw of lane (msg.sender, `drafter`, `laneId`).
    function cancelThaw(address drafter, uint64 laneId) external {
        Lane storage l = _lanes[msg.sender][drafter][laneId];
        if (l.thawReadyAt == 0) revert NoPendingThaw(msg.sender, drafter, laneId);
        uint256 amount = l.thawing;
        (l.thawing, l.thawReadyAt) = (0, 0);
        emit ThawCancelled(msg.sender, drafter, laneId, amount);
    }

    /// @notice From `readyAt` on, moves the thawing amount, or what redemptions left of it, from
    ///         lane (msg.sender, `drafter`, `laneId`) back to msg.sender's pool, and clears the
    ///         request.
    /// @return amount What moved: min(thawing, lane balance).
    function thaw(address drafter, uint64 laneId) external returns (uint256 amount) {
        Lane storage l = _lanes[msg.sender][drafter][laneId];
        uint64 readyAt = l.thawReadyAt;
        if (readyAt == 0) revert NoPendingThaw(msg.sender, drafter, laneId);
        // INVARIANT: nothing thaws before thawingPeriod after the (last) request.
        if (block.timestamp < readyAt) revert ThawNotReady(readyAt, SafeCast.toUint64(block.timestamp));
        uint256 balance = l.balance;
        uint256 thawing = l.thawing;
        // INVARIANT: a thaw never takes what the drafter redeemed during the period.
        amount = thawing < balance ? thawing : balance;
        l.balance = balance - amount;
        (l.thawing, l.thawReadyAt) = (0, 0);
        _pools[msg.sender] += amount;
        emit Thawed(msg.sender, drafter, laneId, amount);
    }

    /// @notice Lane (`operator`, `drafter`, `laneId`): its balance (including any amount
    ///         thawing), what it paid the drafter in total, what the latest redeemed voucher still
    ///         owes, and the pending thaw ((0, 0) if none).
    function lane(address operator, address drafter, uint64 laneId)
        external
        view
        returns (uint256 balance, uint256 paid, uint256 owed, uint256 thawing, uint64 thawReadyAt)
    {
        Lane storage l = _lanes[operator][drafter][laneId];
        return (l.balance, l.paid, l.owed, l.thawing, l.thawReadyAt);
    }

    /*//////////////////////////////////////////////////////////////
                               VOUCHERS
    //////////////////////////////////////////////////////////////*/

    /// @notice Pays the voucher's drafter (the caller) its increment over what its lane paid it
    ///         before, or as much of it as the lane holds; the rest stays owed and the same
    ///         voucher can be redeemed again later. Pays from lane (v.operator, v.drafter, v.lane)
    ///         only.
    /// @param signature `v.operator`'s EIP-712 signature of `v`, 65 bytes r || s || v, low s.
    /// @return amount What was paid now.
    function redeem(Voucher calldata v, bytes calldata signature) external nonReentrant returns (uint256 amount) {
        address drafter = v.drafter;
        // INVARIANT: a voucher pays only its own drafter, who pulls the payment itself.
        if (msg.sender != drafter) revert NotVoucherDrafter(msg.sender, drafter);
        {
            address signer = ECDSA.recoverCalldata(voucherDigest(v), signature);
            // INVARIANT: only the operator's own signature, for this chain and escrow, spends its lanes.
            if (signer != v.operator) revert BadSigner(signer, v.operator);
        }
        Lane storage l = _lanes[v.operator][drafter][v.lane];
        uint256 paidBefore = l.paid;
        // INVARIANT: a lane's paid only grows, and never beyond a voucher signed for that lane.
        if (v.cumulativeWei <= paidBefore) revert VoucherNotNewer(v.cumulativeWei, paidBefore);
        uint256 increment = v.cumulativeWei - paidBefore;
        uint256 balance = l.balance;
        if (balance == 0) revert LaneEmpty(v.operator, drafter, v.lane, increment);

        // INVARIANT: a redemption pays only from its own lane, and at most what the lane holds.
        amount = increment < balance ? increment : balance;
        l.paid = paidBefore + amount;
        l.owed = increment - amount;
        l.balance = balance - amount;
        emit Redeemed(v.operator, drafter, v.lane, v.cumulativeWei, amount);
        if (increment != amount) emit Owed(v.operator, drafter, v.lane, increment - amount);
        _send(drafter, amount);
    }

    /// @notice The EIP-712 digest an operator signs for `v`.
    function voucherDigest(Voucher calldata v) public view returns (bytes32) {
        bytes32 structHash =
            keccak256(abi.encode(VOUCHER_TYPEHASH, v.operator, v.drafter, v.lane, v.cumulativeWei, v.issuedAt));
        return _hashTypedDataV4(structHash);
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /*//////////////////////////////////////////////////////////////
                               INTERNALS
    //////////////////////////////////////////////////////////////*/

    function _deposit(address operator) internal {
        if (msg.value == 0) revert ZeroAmount();
        uint256 pool = _pools[operator] + msg.value;
        _pools[operator] = pool;
        emit Deposited(operator, msg.sender, msg.value, pool);
    }

    /// @dev Sends `amount` wei to `to` (nothing for 0), reverting if the call fails.
    function _send(address to, uint256 amount) internal {
        if (amount == 0) return;
        (bool ok,) = to.call{value: amount}("");
        if (!ok) revert TransferFailed(to, amount);
    }
}
