// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {EnumerableSet} from "@openzeppelin/contracts/utils/structs/EnumerableSet.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

/// @title SpecmarketBond
/// @notice Bond, EIP-712 answer receipts and disputes for specmarket's bonded target operators.
///
/// A target operator posts a bond and commits to a model. For every answer it signs a `Receipt`
/// off-chain; serving costs no transaction. Only disputes touch the chain:
///  - equivocation (two receipts for one request with different outputs) is slashed at once;
///  - a wrong-token challenge names a position, posts `challengerBond`, and is decided by an
///    M-of-N quorum of owner-managed referees that re-execute that one step and sign a `Verdict`.
///
/// Drafters are never parties: the only funds this contract holds are operator bonds, challenger
/// bonds (each the challenger's own) and credits waiting to be withdrawn. Every payout is a
/// credit followed by a pull `withdraw()`.
///
/// @dev Hashing, for off-chain code (also in contracts/README.md):
///  - `hashOutput(tokens)` and the request's `promptHash` are `keccak256(abi.encodePacked(uint32[]))`,
///    i.e. keccak256 over each token as a 32-byte big-endian word (array elements are padded in
///    `abi.encodePacked`), with no length prefix; an empty array hashes to keccak256("").
///  - `requestHash = keccak256(abi.encode(REQUEST_TYPEHASH, promptHash, seed, temperatureMicros,
///    topK, topPMicros, maxTokens))`.
///  - receipts and verdicts are EIP-712 typed data in the domain ("SpecmarketBond", "1", chainid,
///    address(this)).
contract SpecmarketBond is EIP712, Ownable2Step, ReentrancyGuard {
    using EnumerableSet for EnumerableSet.AddressSet;

    /*//////////////////////////////////////////////////////////////
                                 TYPES
    //////////////////////////////////////////////////////////////*/

    /// @notice An operator's signed statement that `outputHash` is its answer to `requestHash`.
    struct Receipt {
        address operator;
        bytes32 modelHash;
        bytes32 requestHash;
        bytes32 outputHash;
        uint32 tokenCount;
        uint64 issuedAt;
    }

    /// @notice Sampling parameters of a request; fixed-point values are in millionths.
    struct SamplingParams {
        uint64 seed;
        uint32 temperatureMicros;
        uint32 topK;
        uint32 topPMicros;
        uint32 maxTokens;
    }

    /// @notice Lifecycle of a wrong-token challenge. `None` marks an id that was never used.
    enum ChallengeStatus {
        None,
        Open,
        OperatorAtFault,
        OperatorCleared,
        Expired
    }

    /// @notice Why an operator was slashed.
    enum SlashReason {
        Equivocation,
        WrongToken
    }

    /// @notice Constructor parameters (see the immutables of the same names).
    struct Config {
        uint256 minBond;
        uint256 challengeWindow;
        uint256 unbondingDelay;
        uint256 challengerBond;
        uint256 resolveTimeout;
        uint256 slashAmount;
        uint256 challengerRewardBps;
        address treasury;
    }

    /// @dev Operator record: one packed slot plus the model commitment.
    struct Operator {
        uint128 bond;
        uint48 unbondAt; // 0 while active; otherwise the earliest time `withdrawBond` may succeed
        uint32 openChallenges;
        bool registered;
        bytes32 modelHash;
    }

    /// @notice A wrong-token challenge. `receiptDigest` (the receipt's EIP-712 digest) commits to
    ///         the operator, model, prompt, sampling params and output; with `position` it is the
    ///         whole disputed claim.
    struct Challenge {
        address challenger;
        uint96 bond;
        address operator;
        uint48 createdAt;
        uint32 position;
        ChallengeStatus status;
        bytes32 receiptDigest;
    }

    /*//////////////////////////////////////////////////////////////
                               CONSTANTS
    //////////////////////////////////////////////////////////////*/

    /// @notice EIP-712 type hash of `Receipt`.
    bytes32 public constant RECEIPT_TYPEHASH = keccak256(
        "Receipt(address operator,bytes32 modelHash,bytes32 requestHash,bytes32 outputHash,uint32 tokenCount,uint64 issuedAt)"
    );

    /// @notice Type hash mixed into `hashRequest` (the request is hashed EIP-712 style, but is not
    ///         itself signed as typed data).
    bytes32 public constant REQUEST_TYPEHASH = keccak256(
        "Request(bytes32 promptHash,uint64 seed,uint32 temperatureMicros,uint32 topK,uint32 topPMicros,uint32 maxTokens)"
    );

    /// @notice EIP-712 type hash of a referee's `Verdict`.
    bytes32 public constant VERDICT_TYPEHASH = keccak256("Verdict(uint256 challengeId,bool operatorAtFault)");

    /// @notice Denominator of `challengerRewardBps`.
    uint256 public constant BPS = 10_000;

    /// @notice Longest unbonding delay the constructor accepts (so `unbondAt` always fits uint48
    ///         and no configuration can lock a bond for good).
    uint256 public constant MAX_UNBONDING_DELAY = 5 * 365 days;

    /*//////////////////////////////////////////////////////////////
                           IMMUTABLE CONFIG
    //////////////////////////////////////////////////////////////*/

    /// @notice Least bond `register` accepts.
    uint256 public immutable minBond;
    /// @notice Seconds after `issuedAt` during which a receipt can be challenged (inclusive).
    uint256 public immutable challengeWindow;
    /// @notice Seconds after a challenge opens during which referees can resolve it (inclusive);
    ///         after that anyone can refund it.
    uint256 public immutable resolveTimeout;
    /// @notice Seconds between `requestUnbond` and the earliest `withdrawBond`;
    ///         always > challengeWindow + resolveTimeout.
    uint256 public immutable unbondingDelay;
    /// @notice Exact amount a challenger posts with `challenge`.
    uint256 public immutable challengerBond;
    /// @notice Configured slash; a slash takes min(slashAmount, bond).
    uint256 public immutable slashAmount;
    /// @notice Share of each slash credited to the challenger/reporter, in basis points (< BPS).
    uint256 public immutable challengerRewardBps;
    /// @notice Receives the rest of each slash.
    address public immutable treasury;

    /*//////////////////////////////////////////////////////////////
                                 STATE
    //////////////////////////////////////////////////////////////*/

    mapping(address operator => Operator) internal _operators;
    mapping(uint256 id => Challenge) internal _challenges;
    /// @notice Id the next challenge gets; ids start at 1.
    uint256 public nextChallengeId = 1;
    /// @notice Pull-payment balances.
    mapping(address account => uint256) public credits;
    /// @notice Whether (operator, requestHash) has already been slashed for equivocation.
    mapping(address operator => mapping(bytes32 requestHash => bool)) public equivocationSlashed;
    /// @notice Whether a receipt (by EIP-712 digest) has already been slashed for a wrong token.
    mapping(bytes32 receiptDigest => bool) public receiptSlashed;

    EnumerableSet.AddressSet internal _referees;
    /// @notice Verdict signatures `resolve` needs (M of N). Always 0 < threshold <= refereeCount().
    uint256 public threshold;

    /*//////////////////////////////////////////////////////////////
                                 EVENTS
    //////////////////////////////////////////////////////////////*/

    event OperatorRegistered(address indexed operator, bytes32 indexed modelHash, uint256 bond);
    event BondToppedUp(address indexed operator, uint256 amount, uint256 newBond);
    event UnbondRequested(address indexed operator, uint256 unbondAt);
    event BondWithdrawn(address indexed operator, uint256 amount);
    /// @notice Everything a referee needs to re-execute the disputed step, from the event alone.
    event ChallengeOpened(
        uint256 indexed id,
        address indexed operator,
        address indexed challenger,
        bytes32 receiptDigest,
        bytes32 modelHash,
        uint32 position,
        SamplingParams params,
        uint32[] prompt,
        uint32[] output
    );
    event ChallengeResolved(uint256 indexed id, address indexed operator, bool operatorAtFault, uint256 slashed);
    event ChallengeExpired(uint256 indexed id, address indexed challenger, uint256 refunded);
    event EquivocationProven(
        address indexed operator, bytes32 indexed requestHash, bytes32 outputHashA, bytes32 outputHashB
    );
    event OperatorSlashed(
        address indexed operator,
        address indexed reporter,
        SlashReason indexed reason,
        uint256 amount,
        uint256 reporterReward,
        uint256 treasuryShare
    );
    event Credited(address indexed account, uint256 amount);
    event Withdrawn(address indexed account, uint256 amount);
    event RefereeAdded(address indexed referee);
    event RefereeRemoved(address indexed referee);
    event ThresholdChanged(uint256 oldThreshold, uint256 newThreshold);

    /*//////////////////////////////////////////////////////////////
                                 ERRORS
    //////////////////////////////////////////////////////////////*/

    // constructor
    error ZeroMinBond();
    error ZeroChallengeWindow();
    error ZeroResolveTimeout();
    error UnbondingDelayTooShort(uint256 unbondingDelay, uint256 challengeWindow, uint256 resolveTimeout);
    error UnbondingDelayTooLong(uint256 unbondingDelay, uint256 maxUnbondingDelay);
    error InvalidChallengerBond(uint256 challengerBond);
    error ZeroSlashAmount();
    error RewardBpsTooHigh(uint256 bps);
    error ZeroTreasury();
    // operators
    error BondBelowMinimum(uint256 sent, uint256 minBond);
    error AlreadyRegistered(address operator);
    error NotRegistered(address operator);
    error ZeroValue();
    error AlreadyUnbonding(address operator, uint256 unbondAt);
    error UnbondNotRequested(address operator);
    error UnbondingDelayNotElapsed(address operator, uint256 unbondAt, uint256 nowTs);
    error HasOpenChallenges(address operator, uint256 openChallenges);
    // receipts
    error InvalidReceiptSigner(address expected, address recovered);
    // equivocation
    error ReceiptOperatorsDiffer(address operatorA, address operatorB);
    error RequestHashesDiffer(bytes32 requestHashA, bytes32 requestHashB);
    error ModelHashesDiffer(bytes32 modelHashA, bytes32 modelHashB);
    error OutputHashesEqual(bytes32 outputHash);
    error EquivocationAlreadySlashed(address operator, bytes32 requestHash);
    // challenges
    error WrongChallengerBond(uint256 sent, uint256 required);
    error ModelHashMismatch(bytes32 committed, bytes32 receipt);
    error RequestHashMismatch(bytes32 computed, bytes32 receipt);
    error OutputHashMismatch(bytes32 computed, bytes32 receipt);
    error TokenCountMismatch(uint256 outputLength, uint32 tokenCount);
    error PositionOutOfRange(uint32 position, uint256 outputLength);
    error ReceiptFromFuture(uint64 issuedAt, uint256 nowTs);
    error ChallengeWindowClosed(uint64 issuedAt, uint256 windowEnd, uint256 nowTs);
    error ReceiptAlreadySlashed(bytes32 receiptDigest);
    error ChallengeNotOpen(uint256 id, ChallengeStatus status);
    error ResolveWindowClosed(uint256 id, uint256 deadline, uint256 nowTs);
    error ResolveWindowNotClosed(uint256 id, uint256 deadline, uint256 nowTs);
    // referees
    error ZeroReferee();
    error AlreadyReferee(address referee);
    error NotReferee(address account);
    error InvalidThreshold(uint256 threshold, uint256 refereeCount);
    error SignersNotAscending(address previous, address signer);
    error BelowThreshold(uint256 signatures, uint256 threshold);
    // payouts
    error NothingToWithdraw(address account);
    error WithdrawFailed(address account, uint256 amount);

    /*//////////////////////////////////////////////////////////////
                              CONSTRUCTOR
    //////////////////////////////////////////////////////////////*/

    /// @param owner_ Manages the referee set (and nothing else: it can't touch funds).
    /// @param config Immutable parameters, validated here (see the `Config` fields).
    /// @param referees_ Initial referees (distinct, non-zero).
    /// @param threshold_ Initial verdict threshold, 0 < threshold_ <= referees_.length.
    constructor(address owner_, Config memory config, address[] memory referees_, uint256 threshold_)
        EIP712("SpecmarketBond", "1")
        Ownable(owner_)
    {
        // INVARIANT: an operator must have something at stake.
        if (config.minBond == 0) revert ZeroMinBond();
        // INVARIANT: receipts must be challengeable for some time.
        if (config.challengeWindow == 0) revert ZeroChallengeWindow();
        // INVARIANT: referees must have some time to resolve.
        if (config.resolveTimeout == 0) revert ZeroResolveTimeout();
        // INVARIANT: a bond can't leave while a receipt issued before unbonding is still
        //            challengeable, or a challenge on it can still be resolved.
        if (config.unbondingDelay <= config.challengeWindow + config.resolveTimeout) {
            revert UnbondingDelayTooShort(config.unbondingDelay, config.challengeWindow, config.resolveTimeout);
        }
        // INVARIANT: requestUnbond can always compute unbondAt, so every bond can leave.
        if (config.unbondingDelay > MAX_UNBONDING_DELAY) {
            revert UnbondingDelayTooLong(config.unbondingDelay, MAX_UNBONDING_DELAY);
        }
        // INVARIANT: a challenge costs something (spam) and its bond fits the packed record.
        if (config.challengerBond == 0 || config.challengerBond > type(uint96).max) {
            revert InvalidChallengerBond(config.challengerBond);
        }
        // INVARIANT: a proven fault costs the operator something.
        if (config.slashAmount == 0) revert ZeroSlashAmount();
        // INVARIANT: part of every slash leaves the operator's reach, so self-reporting costs.
        if (config.challengerRewardBps >= BPS) revert RewardBpsTooHigh(config.challengerRewardBps);
        // INVARIANT: the treasury share has an owner.
        if (config.treasury == address(0)) revert ZeroTreasury();

        minBond = config.minBond;
        challengeWindow = config.challengeWindow;
        unbondingDelay = config.unbondingDelay;
        challengerBond = config.challengerBond;
        resolveTimeout = config.resolveTimeout;
        slashAmount = config.slashAmount;
        challengerRewardBps = config.challengerRewardBps;
        treasury = config.treasury;

        for (uint256 i; i < referees_.length; ++i) {
            _addReferee(referees_[i]);
        }
        _setThreshold(threshold_);
    }

    /*//////////////////////////////////////////////////////////////
                               OPERATORS
    //////////////////////////////////////////////////////////////*/

    /// @notice Registers msg.sender as an operator committed to `modelHash`, bonding msg.value.
    /// @param modelHash Commitment to the target model (e.g. the sha256 of its weights manifest).
    function register(bytes32 modelHash) external payable {
        Operator storage op = _operators[msg.sender];
        // INVARIANT: one live registration per address.
        if (op.registered) revert AlreadyRegistered(msg.sender);
        // INVARIANT: a new operator is bonded at least minBond.
        if (msg.value < minBond) revert BondBelowMinimum(msg.value, minBond);

        op.registered = true;
        op.bond = SafeCast.toUint128(msg.value);
        op.modelHash = modelHash;
        // unbondAt and openChallenges are already 0: withdrawBond deletes the whole record.
        emit OperatorRegistered(msg.sender, modelHash, msg.value);
    }

    /// @notice Adds msg.value to msg.sender's bond (also while unbonding).
    function topUp() external payable {
        Operator storage op = _operators[msg.sender];
        if (!op.registered) revert NotRegistered(msg.sender);
        if (msg.value == 0) revert ZeroValue();

        uint256 newBond = op.bond + msg.value;
        op.bond = SafeCast.toUint128(newBond);
        emit BondToppedUp(msg.sender, msg.value, newBond);
    }

    /// @notice Starts the unbonding delay. The operator stops being active: receipts it signs from
    ///         now on should not be relied on; receipts issued before stay challengeable and the
    ///         bond stays slashable until it is withdrawn.
    function requestUnbond() external {
        Operator storage op = _operators[msg.sender];
        if (!op.registered) revert NotRegistered(msg.sender);
        if (op.unbondAt != 0) revert AlreadyUnbonding(msg.sender, op.unbondAt);

        uint256 unbondAt = block.timestamp + unbondingDelay;
        op.unbondAt = SafeCast.toUint48(unbondAt);
        emit UnbondRequested(msg.sender, unbondAt);
    }

    /// @notice After the unbonding delay, with no open challenge, credits the remaining bond to
    ///         the operator's pull balance and ends the registration (call `withdraw()` next).
    function withdrawBond() external {
        Operator storage op = _operators[msg.sender];
        if (!op.registered) revert NotRegistered(msg.sender);
        uint256 unbondAt = op.unbondAt;
        if (unbondAt == 0) revert UnbondNotRequested(msg.sender);
        // INVARIANT: no bond leaves before the unbonding delay.
        if (block.timestamp < unbondAt) revert UnbondingDelayNotElapsed(msg.sender, unbondAt, block.timestamp);
        // INVARIANT: no bond leaves while a challenge against it is open.
        if (op.openChallenges != 0) revert HasOpenChallenges(msg.sender, op.openChallenges);

        uint256 amount = op.bond;
        delete _operators[msg.sender];
        emit BondWithdrawn(msg.sender, amount);
        _credit(msg.sender, amount);
    }

    /// @notice An operator's record.
    /// @return registered Whether it holds a registration (until `withdrawBond`).
    /// @return active Registered, not unbonding and bonded at least minBond: its new receipts can be relied on.
    /// @return modelHash Its model commitment.
    /// @return bond Its current bond (after slashes).
    /// @return unbondAt 0, or when `withdrawBond` may succeed.
    /// @return openChallenges Wrong-token challenges against it not yet closed.
    function operatorInfo(address operator)
        external
        view
        returns (
            bool registered,
            bool active,
            bytes32 modelHash,
            uint256 bond,
            uint256 unbondAt,
            uint256 openChallenges
        )
    {
        Operator storage op = _operators[operator];
        registered = op.registered;
        active = registered && op.unbondAt == 0 && op.bond >= minBond;
        modelHash = op.modelHash;
        bond = op.bond;
        unbondAt = op.unbondAt;
        openChallenges = op.openChallenges;
    }

    /*//////////////////////////////////////////////////////////////
                            HASHING HELPERS
    //////////////////////////////////////////////////////////////*/

    /// @notice The request hash a receipt carries.
    /// @dev keccak256(abi.encode(REQUEST_TYPEHASH, keccak256(abi.encodePacked(prompt)), seed,
    ///      temperatureMicros, topK, topPMicros, maxTokens)); every value is one 32-byte word.
    function hashRequest(
        uint32[] calldata prompt,
        uint64 seed,
        uint32 temperatureMicros,
        uint32 topK,
        uint32 topPMicros,
        uint32 maxTokens
    ) external pure returns (bytes32) {
        return _hashRequest(prompt, SamplingParams(seed, temperatureMicros, topK, topPMicros, maxTokens));
    }

    /// @notice The output hash a receipt carries: keccak256 over each token as a 32-byte word.
    function hashOutput(uint32[] calldata output) external pure returns (bytes32) {
        return _hashTokens(output);
    }

    /// @notice The EIP-712 digest an operator signs for `r`.
    function receiptDigest(Receipt calldata r) public view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(
                abi.encode(
                    RECEIPT_TYPEHASH, r.operator, r.modelHash, r.requestHash, r.outputHash, r.tokenCount, r.issuedAt
                )
            )
        );
    }

    /// @notice The address that signed `r` (reverts on malformed or malleable (high-s) signatures).
    function receiptSigner(Receipt calldata r, bytes calldata sig) external view returns (address) {
        return ECDSA.recoverCalldata(receiptDigest(r), sig);
    }

    /// @notice The EIP-712 digest a referee signs for a verdict.
    function verdictDigest(uint256 challengeId, bool operatorAtFault) public view returns (bytes32) {
        return _hashTypedDataV4(keccak256(abi.encode(VERDICT_TYPEHASH, challengeId, operatorAtFault)));
    }

    /// @notice This contract's EIP-712 domain separator.
    function domainSeparator() external view returns (bytes32) {
        return _domainSeparatorV4();
    }

    /*//////////////////////////////////////////////////////////////
                              EQUIVOCATION
    //////////////////////////////////////////////////////////////*/

    /// @notice Slashes an operator that signed two receipts for the same request (and model) with
    ///         different outputs. msg.sender is credited the reporter's share. Each
    ///         (operator, requestHash) can be slashed for equivocation once.
    function slashEquivocation(Receipt calldata a, bytes calldata sigA, Receipt calldata b, bytes calldata sigB)
        external
    {
        address operator = a.operator;
        if (operator != b.operator) revert ReceiptOperatorsDiffer(operator, b.operator);
        if (a.requestHash != b.requestHash) revert RequestHashesDiffer(a.requestHash, b.requestHash);
        if (a.modelHash != b.modelHash) revert ModelHashesDiffer(a.modelHash, b.modelHash);
        if (a.outputHash == b.outputHash) revert OutputHashesEqual(a.outputHash);
        if (!_operators[operator].registered) revert NotRegistered(operator);
        // INVARIANT: one equivocation slash per (operator, request).
        if (equivocationSlashed[operator][a.requestHash]) revert EquivocationAlreadySlashed(operator, a.requestHash);
        // INVARIANT: both receipts are the operator's own signatures.
        _checkReceiptSigner(a, sigA);
        _checkReceiptSigner(b, sigB);

        equivocationSlashed[operator][a.requestHash] = true;
        emit EquivocationProven(operator, a.requestHash, a.outputHash, b.outputHash);
        _slash(operator, msg.sender, SlashReason.Equivocation);
    }

    /*//////////////////////////////////////////////////////////////
                              CHALLENGES
    //////////////////////////////////////////////////////////////*/

    /// @notice Challenges the token at `position` of a receipted answer, posting `challengerBond`.
    ///         The full request and output are checked against the receipt and emitted in
    ///         `ChallengeOpened`, so referees can re-execute from the event alone.
    /// @return id The new challenge's id.
    function challenge(
        Receipt calldata r,
        bytes calldata sig,
        uint32[] calldata prompt,
        SamplingParams calldata params,
        uint32[] calldata output,
        uint32 position
    ) external payable returns (uint256 id) {
        // INVARIANT: every challenge posts exactly challengerBond.
        if (msg.value != challengerBond) revert WrongChallengerBond(msg.value, challengerBond);
        bytes32 digest = _checkChallengeable(r, sig);
        _checkDisputedData(r, prompt, params, output, position);

        id = nextChallengeId++;
        _challenges[id] = Challenge({
            challenger: msg.sender,
            bond: uint96(msg.value), // fits: msg.value == challengerBond <= type(uint96).max
            operator: r.operator,
            createdAt: uint48(block.timestamp),
            position: position,
            status: ChallengeStatus.Open,
            receiptDigest: digest
        });
        ++_operators[r.operator].openChallenges;
        emit ChallengeOpened(id, r.operator, msg.sender, digest, r.modelHash, position, params, prompt, output);
    }

    /// @notice Closes an open challenge with a referee quorum's verdict. Anyone may submit it.
    /// @param sigs EIP-712 `Verdict(id, operatorAtFault)` signatures of at least `threshold`
    ///        distinct current referees, ordered by strictly ascending signer address.
    function resolve(uint256 id, bool operatorAtFault, bytes[] calldata sigs) external {
        Challenge storage c = _challenges[id];
        if (c.status != ChallengeStatus.Open) revert ChallengeNotOpen(id, c.status);
        uint256 deadline = uint256(c.createdAt) + resolveTimeout;
        // INVARIANT: resolve and refundExpired partition time; a challenge closes exactly once.
        if (block.timestamp > deadline) revert ResolveWindowClosed(id, deadline, block.timestamp);
        // INVARIANT: no verdict without a quorum of distinct current referees.
        _checkQuorum(verdictDigest(id, operatorAtFault), sigs);

        address operator = c.operator;
        address challenger = c.challenger;
        uint256 bond = c.bond;
        --_operators[operator].openChallenges;

        if (operatorAtFault) {
            c.status = ChallengeStatus.OperatorAtFault;
            uint256 slashed;
            // A receipt is slashed at most once, however many challenges name its positions.
            if (!receiptSlashed[c.receiptDigest]) {
                receiptSlashed[c.receiptDigest] = true;
                slashed = _slash(operator, challenger, SlashReason.WrongToken);
            }
            emit ChallengeResolved(id, operator, true, slashed);
            _credit(challenger, bond);
        } else {
            c.status = ChallengeStatus.OperatorCleared;
            emit ChallengeResolved(id, operator, false, 0);
            // A false challenge's bond compensates the operator it accused.
            _credit(operator, bond);
        }
    }

    /// @notice Refunds the challenger of a challenge the referees did not resolve in time.
    function refundExpired(uint256 id) external {
        Challenge storage c = _challenges[id];
        if (c.status != ChallengeStatus.Open) revert ChallengeNotOpen(id, c.status);
        uint256 deadline = uint256(c.createdAt) + resolveTimeout;
        if (block.timestamp <= deadline) revert ResolveWindowNotClosed(id, deadline, block.timestamp);

        c.status = ChallengeStatus.Expired;
        --_operators[c.operator].openChallenges;
        emit ChallengeExpired(id, c.challenger, c.bond);
        _credit(c.challenger, c.bond);
    }

    /// @notice A challenge's record (status `None` for an unused id).
    function getChallenge(uint256 id) external view returns (Challenge memory) {
        return _challenges[id];
    }

    /*//////////////////////////////////////////////////////////////
                                REFEREES
    //////////////////////////////////////////////////////////////*/

    /// @notice Adds a referee (owner only).
    function addReferee(address referee) external onlyOwner {
        _addReferee(referee);
    }

    /// @notice Removes a referee (owner only); the threshold must still be reachable afterwards.
    function removeReferee(address referee) external onlyOwner {
        if (!_referees.remove(referee)) revert NotReferee(referee);
        // INVARIANT: threshold <= refereeCount.
        if (threshold > _referees.length()) revert InvalidThreshold(threshold, _referees.length());
        emit RefereeRemoved(referee);
    }

    /// @notice Sets the verdict threshold M (owner only), 0 < M <= refereeCount().
    function setThreshold(uint256 newThreshold) external onlyOwner {
        _setThreshold(newThreshold);
    }

    /// @notice Whether `account` is a current referee.
    function isReferee(address account) external view returns (bool) {
        return _referees.contains(account);
    }

    /// @notice Number of current referees (N).
    function refereeCount() external view returns (uint256) {
        return _referees.length();
    }

    /// @notice The current referees, in no particular order.
    function referees() external view returns (address[] memory) {
        return _referees.values();
    }

    /*//////////////////////////////////////////////////////////////
                                PAYOUTS
    //////////////////////////////////////////////////////////////*/

    /// @notice Sends msg.sender its whole credit.
    function withdraw() external nonReentrant {
        uint256 amount = credits[msg.sender];
        if (amount == 0) revert NothingToWithdraw(msg.sender);
        credits[msg.sender] = 0;
        emit Withdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        if (!ok) revert WithdrawFailed(msg.sender, amount);
    }

    /*//////////////////////////////////////////////////////////////
                               INTERNALS
    //////////////////////////////////////////////////////////////*/

    function _hashTokens(uint32[] calldata tokens) internal pure returns (bytes32) {
        return keccak256(abi.encodePacked(tokens));
    }

    function _hashRequest(uint32[] calldata prompt, SamplingParams memory p) internal pure returns (bytes32) {
        return keccak256(
            abi.encode(
                REQUEST_TYPEHASH, _hashTokens(prompt), p.seed, p.temperatureMicros, p.topK, p.topPMicros, p.maxTokens
            )
        );
    }

    /// @dev Reverts unless `sig` is `r.operator`'s signature of `r`; returns the digest.
    function _checkReceiptSigner(Receipt calldata r, bytes calldata sig) internal view returns (bytes32 digest) {
        digest = receiptDigest(r);
        address signer = ECDSA.recoverCalldata(digest, sig);
        if (signer != r.operator) revert InvalidReceiptSigner(r.operator, signer);
    }

    /// @dev Signature, operator, model, window and prior-slash checks of a challenged receipt.
    function _checkChallengeable(Receipt calldata r, bytes calldata sig) internal view returns (bytes32 digest) {
        Operator storage op = _operators[r.operator];
        if (!op.registered) revert NotRegistered(r.operator);
        if (r.modelHash != op.modelHash) revert ModelHashMismatch(op.modelHash, r.modelHash);
        if (block.timestamp < r.issuedAt) revert ReceiptFromFuture(r.issuedAt, block.timestamp);
        uint256 windowEnd = uint256(r.issuedAt) + challengeWindow;
        // INVARIANT: a receipt is challengeable only within its window.
        if (block.timestamp > windowEnd) revert ChallengeWindowClosed(r.issuedAt, windowEnd, block.timestamp);
        digest = _checkReceiptSigner(r, sig);
        if (receiptSlashed[digest]) revert ReceiptAlreadySlashed(digest);
    }

    /// @dev The disputed prompt, params and output must be exactly what the receipt commits to.
    function _checkDisputedData(
        Receipt calldata r,
        uint32[] calldata prompt,
        SamplingParams calldata params,
        uint32[] calldata output,
        uint32 position
    ) internal pure {
        bytes32 requestHash = _hashRequest(prompt, params);
        if (requestHash != r.requestHash) revert RequestHashMismatch(requestHash, r.requestHash);
        bytes32 outputHash = _hashTokens(output);
        if (outputHash != r.outputHash) revert OutputHashMismatch(outputHash, r.outputHash);
        if (output.length != r.tokenCount) revert TokenCountMismatch(output.length, r.tokenCount);
        if (position >= output.length) revert PositionOutOfRange(position, output.length);
    }

    /// @dev Reverts unless `sigs` hold >= threshold signatures of `digest` by distinct current
    ///      referees in strictly ascending signer order.
    function _checkQuorum(bytes32 digest, bytes[] calldata sigs) internal view {
        if (sigs.length < threshold) revert BelowThreshold(sigs.length, threshold);
        address previous;
        for (uint256 i; i < sigs.length; ++i) {
            address signer = ECDSA.recoverCalldata(digest, sigs[i]);
            // INVARIANT: strictly ascending signers, so no referee counts twice.
            if (signer <= previous) revert SignersNotAscending(previous, signer);
            if (!_referees.contains(signer)) revert NotReferee(signer);
            previous = signer;
        }
    }

    /// @dev Takes min(slashAmount, bond) from `operator`; credits `reporter` its share, the treasury the rest.
    function _slash(address operator, address reporter, SlashReason reason) internal returns (uint256 amount) {
        Operator storage op = _operators[operator];
        amount = op.bond < slashAmount ? op.bond : slashAmount;
        // amount <= op.bond, a uint128, so the cast is exact.
        // forge-lint: disable-next-line(unsafe-typecast)
        op.bond -= uint128(amount);
        uint256 reward = amount * challengerRewardBps / BPS;
        emit OperatorSlashed(operator, reporter, reason, amount, reward, amount - reward);
        _credit(reporter, reward);
        _credit(treasury, amount - reward);
    }

    function _credit(address account, uint256 amount) internal {
        if (amount == 0) return;
        credits[account] += amount;
        emit Credited(account, amount);
    }

    function _addReferee(address referee) internal {
        if (referee == address(0)) revert ZeroReferee();
        if (!_referees.add(referee)) revert AlreadyReferee(referee);
        emit RefereeAdded(referee);
    }

    function _setThreshold(uint256 newThreshold) internal {
        // INVARIANT: 0 < threshold <= refereeCount, so an empty signature list never resolves.
        if (newThreshold == 0 || newThreshold > _referees.length()) {
            revert InvalidThreshold(newThreshold, _referees.length());
        }
        emit ThresholdChanged(threshold, newThreshold);
        threshold = newThreshold;
    }
}
