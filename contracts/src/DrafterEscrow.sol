// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

/// @title DrafterEscrow
/// @notice Escrow from which a target operator pays its untrusted drafter peers with signed,
///         cumulative vouchers.
///
/// An operator deposits ETH (or anyone deposits for it). For each drafter it signs, off-chain,
/// a `Voucher` stating the total it owes that drafter so far (`cumulativeWei`); each new voucher
/// supersedes the last, as in Filecoin payment channels or Lightning's commitment updates, so
/// paying costs no transaction. The drafter redeems whenever it likes and is paid the increment
/// over what it was paid before: an older or equal voucher pays nothing (`VoucherNotNewer`), so
/// replays are harmless and a drafter only ever needs to keep its newest voucher.
///
/// Partial payment (a choice): a voucher larger than the escrow pays what is there and records
/// the rest as owed (`Owed` event, `owed(operator, drafter)`); the same voucher can be redeemed
/// again after a top-up and pays the rest. Refusing it instead would let an operator that
/// over-signs keep the whole balance out of a drafter's reach.
///
/// The timelock: the operator takes money out only through `requestWithdrawal` and, at least
/// `withdrawalDelay` (>= 2 * REDEEM_WINDOW) later, `withdraw`; the balance stays redeemable
/// meanwhile and `withdraw` pays at most what is left. So a drafter that redeems within
/// REDEEM_WINDOW of a `WithdrawalRequested` event is paid in full for every voucher the escrow
/// covered when the request was made (if the operator signs no more than it covers: see below).
/// The operator's exposure is bounded by its escrow; the drafter's by its work not yet vouched
/// for plus its unredeemed vouchers: it stops drafting when vouchers lag, so about one job's pay.
/// What the timelock does NOT cover: the escrow is one pool per operator, not a channel per
/// drafter, so an operator that signs more than its escrow covers (to other drafters or to an
/// address of its own, redeemed at once) makes vouchers race for the balance. Drafters bound
/// that risk by redeeming often and by watching `balanceOf(operator)`.
///
/// `issuedAt` is informational (off-chain freshness checks) and never checked here: a cumulative
/// voucher never expires, since a newer one only adds to it, and the timelock protects drafters
/// without reference to when a voucher was signed.
///
/// No owner, no admin: the contract holds only escrows, and touches no bond or challenge of
/// SpecmarketBond. Every payment is pulled by its payee (`redeem` by the drafter, `withdraw` by
/// the operator), after its state changes (checks-effects-interactions, `nonReentrant`).
///
/// @dev Hashing, for off-chain code (also in contracts/README.md): vouchers are EIP-712 typed data
///      (primary type `Voucher`) in the domain ("SpecmarketDrafterEscrow", "1", chainid,
///      address(this)), with
///      `Voucher(address operator,address drafter,uint256 cumulativeWei,uint64 issuedAt)`.
///      Signatures are 65 bytes `r || s || v` with low s (high-s twins are refused).
contract DrafterEscrow is EIP712("SpecmarketDrafterEscrow", "1"), ReentrancyGuard {
    /*//////////////////////////////////////////////////////////////
                                 TYPES
    //////////////////////////////////////////////////////////////*/

    /// @notice An operator's signed statement that it owes `drafter` `cumulativeWei` in total.
    struct Voucher {
        address operator;
        address drafter;
        uint256 cumulativeWei;
        uint64 issuedAt;
    }

    /// @dev A pending withdrawal, one slot (no escrow comes near 2**192 wei). readyAt 0: none.
    struct Withdrawal {
        uint192 amount;
        uint64 readyAt;
    }

    /*//////////////////////////////////////////////////////////////
                               CONSTANTS
    //////////////////////////////////////////////////////////////*/

    /// @notice EIP-712 type hash of `Voucher`.
    bytes32 public constant VOUCHER_TYPEHASH =
        keccak256("Voucher(address operator,address drafter,uint256 cumulativeWei,uint64 issuedAt)");

    /// @notice Drafters redeem within this long of a `WithdrawalRequested` event to be paid in
    ///         full for every voucher the escrow covered when the request was made.
    uint256 public constant REDEEM_WINDOW = 1 hours;

    /// @notice Least `withdrawalDelay`: twice the redeem window, so a drafter that redeems late in
    ///         its window still has an hour of margin (block inclusion, congestion).
    uint256 public constant MIN_WITHDRAWAL_DELAY = 2 * REDEEM_WINDOW;

    /// @notice Longest `withdrawalDelay`, so no configuration locks an escrow for good (and
    ///         `readyAt` always fits uint64).
    uint256 public constant MAX_WITHDRAWAL_DELAY = 365 days;

    /// @notice Seconds from `requestWithdrawal` to the earliest `withdraw`.
    uint256 public immutable withdrawalDelay;

    /*//////////////////////////////////////////////////////////////
                                 STATE
    //////////////////////////////////////////////////////////////*/

    mapping(address operator => uint256) internal _balances;
    /// @notice What `drafter` has been paid from `operator`'s escrow in total.
    mapping(address operator => mapping(address drafter => uint256)) public paid;
    /// @notice What the latest voucher `drafter` redeemed still owes it: its cumulativeWei - paid.
    mapping(address operator => mapping(address drafter => uint256)) public owed;
    mapping(address operator => Withdrawal) internal _pending;

    /*//////////////////////////////////////////////////////////////
                             EVENTS, ERRORS
    //////////////////////////////////////////////////////////////*/

    event Deposited(address indexed operator, address indexed from, uint256 amount, uint256 balance);
    event Redeemed(address indexed operator, address indexed drafter, uint256 cumulativeWei, uint256 amount);
    /// @notice A redemption paid `shortWei` less than its voucher's increment (the escrow ran out).
    event Owed(address indexed operator, address indexed drafter, uint256 shortWei);
    /// @notice Drafters should redeem within REDEEM_WINDOW of this event.
    event WithdrawalRequested(address indexed operator, uint256 amount, uint64 readyAt);
    event WithdrawalCancelled(address indexed operator, uint256 amount);
    event Withdrawn(address indexed operator, uint256 amount);

    error ZeroAmount();
    error ZeroAddress();
    error DelayTooShort(uint256 given, uint256 minimum);
    error DelayTooLong(uint256 given, uint256 maximum);
    error NotVoucherDrafter(address caller, address drafter);
    error BadSigner(address recovered, address operator);
    error VoucherNotNewer(uint256 cumulativeWei, uint256 paid);
    error EscrowEmpty(address operator, uint256 owedWei);
    error AmountExceedsBalance(uint256 amount, uint256 balance);
    error NoPendingWithdrawal(address operator);
    error WithdrawalNotReady(uint64 readyAt, uint64 now_);
    error TransferFailed(address to, uint256 amount);

    /*//////////////////////////////////////////////////////////////
                              CONSTRUCTOR
    //////////////////////////////////////////////////////////////*/

    /// @param withdrawalDelay_ Seconds from `requestWithdrawal` to the earliest `withdraw`, in
    ///        [MIN_WITHDRAWAL_DELAY, MAX_WITHDRAWAL_DELAY].
    constructor(uint256 withdrawalDelay_) {
        // INVARIANT: a drafter that redeems within REDEEM_WINDOW of a request beats the withdrawal.
        if (withdrawalDelay_ < MIN_WITHDRAWAL_DELAY) revert DelayTooShort(withdrawalDelay_, MIN_WITHDRAWAL_DELAY);
        // INVARIANT: every requested withdrawal can complete.
        if (withdrawalDelay_ > MAX_WITHDRAWAL_DELAY) revert DelayTooLong(withdrawalDelay_, MAX_WITHDRAWAL_DELAY);
        withdrawalDelay = withdrawalDelay_;
    }

    /*//////////////////////////////////////////////////////////////
                               DEPOSITS
    //////////////////////////////////////////////////////////////*/

    /// @notice Adds msg.value to msg.sender's escrow.
    function deposit() external payable {
        _deposit(msg.sender);
    }

    /// @notice Adds msg.value to `operator`'s escrow (only `operator` can ever withdraw it).
    function depositFor(address operator) external payable {
        if (operator == address(0)) revert ZeroAddress();
        _deposit(operator);
    }

    /*//////////////////////////////////////////////////////////////
                               VOUCHERS
    //////////////////////////////////////////////////////////////*/

    /// @notice Pays the voucher's drafter (the caller) its increment over what it was paid
    ///         before, or as much of it as the escrow holds; the rest stays owed and the same
    ///         voucher can be redeemed again later.
    /// @param signature `v.operator`'s EIP-712 signature of `v`, 65 bytes r || s || v, low s.
    /// @return amount What was paid now.
    function redeem(Voucher calldata v, bytes calldata signature) external nonReentrant returns (uint256 amount) {
        address operator = v.operator;
        address drafter = v.drafter;
        // INVARIANT: a voucher pays only its own drafter, who pulls the payment itself.
        if (msg.sender != drafter) revert NotVoucherDrafter(msg.sender, drafter);
        address signer = ECDSA.recoverCalldata(voucherDigest(v), signature);
        // INVARIANT: only the operator's own signature, for this chain and escrow, spends its escrow.
        if (signer != operator) revert BadSigner(signer, operator);
        uint256 paidBefore = paid[operator][drafter];
        // INVARIANT: paid[operator][drafter] only grows, and never beyond a signed voucher.
        if (v.cumulativeWei <= paidBefore) revert VoucherNotNewer(v.cumulativeWei, paidBefore);
        uint256 increment = v.cumulativeWei - paidBefore;
        uint256 balance = _balances[operator];
        if (balance == 0) revert EscrowEmpty(operator, increment);

        // INVARIANT: a redemption pays at most the operator's own escrow.
        amount = increment < balance ? increment : balance;
        uint256 shortWei = increment - amount;
        paid[operator][drafter] = paidBefore + amount;
        owed[operator][drafter] = shortWei;
        _balances[operator] = balance - amount;
        emit Redeemed(operator, drafter, v.cumulativeWei, amount);
        if (shortWei != 0) emit Owed(operator, drafter, shortWei);
        _send(drafter, amount);
    }

    /// @notice The EIP-712 digest an operator signs for `v`.
    function voucherDigest(Voucher calldata v) public view returns (bytes32) {
        bytes32 structHash = keccak256(abi.encode(VOUCHER_TYPEHASH, v.operator, v.drafter, v.cumulativeWei, v.issuedAt));
        return _hashTypedDataV4(structHash);
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /*//////////////////////////////////////////////////////////////
                              WITHDRAWALS
    //////////////////////////////////////////////////////////////*/

    /// @notice Asks to withdraw `amount` of msg.sender's escrow from `withdrawalDelay` on. Replaces
    ///         any earlier request and restarts the clock. The escrow stays redeemable meanwhile.
    function requestWithdrawal(uint256 amount) external {
        if (amount == 0) revert ZeroAmount();
        uint256 balance = _balances[msg.sender];
        if (amount > balance) revert AmountExceedsBalance(amount, balance);
        // INVARIANT: nothing leaves before withdrawalDelay after the (last) request.
        uint64 readyAt = SafeCast.toUint64(block.timestamp + withdrawalDelay);
        // amount <= balance <= the ETH this contract holds, far below 2**192
        _pending[msg.sender] = Withdrawal(SafeCast.toUint192(amount), readyAt);
        emit WithdrawalRequested(msg.sender, amount, readyAt);
    }

    /// @notice Drops msg.sender's pending withdrawal.
    function cancelWithdrawal() external {
        Withdrawal memory w = _pending[msg.sender];
        if (w.readyAt == 0) revert NoPendingWithdrawal(msg.sender);
        delete _pending[msg.sender];
        emit WithdrawalCancelled(msg.sender, w.amount);
    }

    /// @notice From `readyAt` on, sends msg.sender its requested amount, or what redemptions left
    ///         of it, and clears the request.
    /// @return amount What was sent: min(requested, balance).
    function withdraw() external nonReentrant returns (uint256 amount) {
        Withdrawal memory w = _pending[msg.sender];
        if (w.readyAt == 0) revert NoPendingWithdrawal(msg.sender);
        // INVARIANT: nothing leaves before withdrawalDelay after the (last) request.
        if (block.timestamp < w.readyAt) revert WithdrawalNotReady(w.readyAt, SafeCast.toUint64(block.timestamp));
        uint256 balance = _balances[msg.sender];
        // INVARIANT: a withdrawal never takes what drafters redeemed during the delay.
        amount = w.amount < balance ? w.amount : balance;
        delete _pending[msg.sender];
        _balances[msg.sender] = balance - amount;
        emit Withdrawn(msg.sender, amount);
        _send(msg.sender, amount);
    }

    /*//////////////////////////////////////////////////////////////
                                 VIEWS
    //////////////////////////////////////////////////////////////*/

    /// @notice The escrow held for `operator` (including any amount pending withdrawal).
    function balanceOf(address operator) external view returns (uint256) {
        return _balances[operator];
    }

    /// @notice `operator`'s pending withdrawal: (0, 0) if none.
    function pendingWithdrawal(address operator) external view returns (uint256 amount, uint64 readyAt) {
        Withdrawal memory w = _pending[operator];
        return (w.amount, w.readyAt);
    }

    /*//////////////////////////////////////////////////////////////
                               INTERNALS
    //////////////////////////////////////////////////////////////*/

    function _deposit(address operator) internal {
        if (msg.value == 0) revert ZeroAmount();
        uint256 balance = _balances[operator] + msg.value;
        _balances[operator] = balance;
        emit Deposited(operator, msg.sender, msg.value, balance);
    }

    /// @dev Sends `amount` wei to `to` (nothing for 0), reverting if the call fails.
    function _send(address to, uint256 amount) internal {
        if (amount == 0) return;
        (bool ok,) = to.call{value: amount}("");
        if (!ok) revert TransferFailed(to, amount);
    }
}
