// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {Ownable2Step} from "@openzeppelin/contracts/access/Ownable2Step.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

/// @title SpecmarketBond
/// @notice Bond, EIP-712 answer receipts and disputes for specmarket's bonded target operators.
///
/// A target operator posts a bond and commits to a model. For every answer it signs a `Receipt`
/// off-chain; serving costs no transaction. Only disputes touch the chain:
///  - equivocation (two receipts for one request with different outputs) is slashed at once;
///  - a wrong-token challenge names a position, posts `challengerBond`, and is decided by an
///    M-of-N quorum of referees that re-execute that one step and sign a `Verdict` bound to the
///    challenge's id, receipt digest, position and challenger.
///
/// Referee sets are numbered epochs. The constructor's set is epoch 1; the owner can only
/// propose a next set, which anyone can activate `refereeSetDelay` (> `unbondingDelay`) later.
/// Each challenge snapshots the epoch it was opened in and is decided by that epoch's quorum
/// only, so the owner can neither decide nor stall an open challenge, and an operator who sees a
/// proposal has time to unbond and withdraw before the new set can judge anything.
///
/// Drafters are never parties: the only funds this contract holds are operator bonds, challenger
/// bonds (each the challenger's own) and credits waiting to be withdrawn. Every payout is a
/// credit followed by a pull `withdraw()`. The owner cannot touch any of them.
///
/// @dev Hashing, for off-chain code (also in contracts/README.md):
///  - `hashOutput(tokens)` and the request's `promptHash` are `keccak256(abi.encodePacked(uint32[]))`,
///    i.e. keccak256 over each token as a 32-byte big-endian word (array elements are padded in
///    `abi.encodePacked`), with no length prefix; an empty array hashes to keccak256("").
///  - `requestHash = keccak256(abi.encode(REQUEST_TYPEHASH, promptHash, seed, temperatureMicros,
///    topK, topPMicros, maxTokens, stopHash))`; `stopHash` is `hashStopRule`: the request's stop
///    tokens hashed like a prompt (ascending, distinct), combined with its stop sequences' hashes
///    when it has any: the answer ends at the first stop token, at the first token whose text
///    completes a stop sequence, or at `maxTokens`; ending anywhere else is challengeable
///    (`challengeEnd`).
///  - receipts and verdicts are EIP-712 typed data in the domain ("SpecmarketBond", "1", chainid,
///    address(this)).
contract SpecmarketBond is EIP712, Ownable2Step, ReentrancyGuard {
    /*//////////////////////////////////////////////////////////////
                                 TYPES
    //////////////////////////////////////////////////////////////*/

    /// @notice An operator's signed statement that `outputHash` is its answer to `requestHash`.
    /// @dev `storeNonce` names the receipt store that signed it (a random number the operator's node
    ///      draws when it creates its store). Two receipts conflict, and are slashed as equivocation,
    ///      only when one store signed both: a node that lost its store, or a second replica with
    ///      the same key, signs under another nonce, so float noise between them cannot be slashed
    ///      without a referee. A wrong answer under any nonce is still a wrong-token challenge.
    struct Receipt {
        address operator;
        bytes32 modelHash;
        bytes32 requestHash;
        bytes32 outputHash;
        uint32 tokenCount;
        uint64 issuedAt;
        uint64 storeNonce;
    }

    /// @notice Sampling parameters of a request; fixed-point values are in millionths. `stopHash`
    ///         commits to the stop rule (`hashStopRule` of a `StopRule`): the model's end-of-sequence
    ///         tokens and the request's stop sequences (`keccak256("")`: none, the answer runs to
    ///         `maxTokens`).
    struct SamplingParams {
        uint64 seed;
        uint32 temperatureMicros;
        uint32 topK;
        uint32 topPMicros;
        uint32 maxTokens;
        bytes32 stopHash;
    }

    /// @notice The stop rule a request's `stopHash` commits to (`hashStopRule`): the answer ends at the
    ///         first of `tokens` (the model's end-of-sequence tokens), or at the first token whose text
    ///         completes one of `sequences` (OpenAI's `stop`), or at `maxTokens`.
    struct StopRule {
        uint32[] tokens;
        string[] sequences;
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
        uint256 refereeSetDelay;
    }

    /// @dev Operator record: one packed slot plus the model commitment.
    struct Operator {
        uint128 bond;
        uint48 unbondAt; // 0 while active; otherwise the earliest time `withdrawBond` may succeed
        uint32 openChallenges;
        bool registered;
        bytes32 modelHash;
    }

    /// @notice A wrong-token challenge, as `getChallenge` returns it. `receiptDigest` (the
    ///         receipt's EIP-712 digest) commits to the operator, model, prompt, sampling params
    ///         and output; with `position` it is the whole disputed claim. `refereeEpoch` is the
    ///         referee set that decides it: the one current when it was opened.
    struct Challenge {
        address challenger;
        uint96 bond;
        address operator;
        uint48 createdAt;
        uint32 position;
        ChallengeStatus status;
        bytes32 receiptDigest;
        uint64 refereeEpoch;
    }

    /// @dev A challenge as stored: three slots. Its bond is not stored, as it is always
    ///      `challengerBond` (an immutable), which leaves room for `refereeEpoch` in slot 0.
    struct ChallengeRecord {
        address challenger;
        uint64 refereeEpoch;
        address operator;
        uint48 createdAt;
        uint32 position;
        ChallengeStatus status;
        bytes32 receiptDigest;
    }

    /// @dev One epoch's referee set. `isMember` mirrors `members` (which has no duplicates).
    struct RefereeSet {
        address[] members;
        uint256 threshold;
        mapping(address account => bool) isMember;
    }

    /*//////////////////////////////////////////////////////////////
                               CONSTANTS
    //////////////////////////////////////////////////////////////*/

    /// @notice EIP-712 type hash of `Receipt`.
    bytes32 public constant RECEIPT_TYPEHASH = keccak256(
        "Receipt(address operator,bytes32 modelHash,bytes32 requestHash,bytes32 outputHash,uint32 tokenCount,uint64 issuedAt,uint64 storeNonce)"
    );

    /// @notice Type hash mixed into `hashRequest` (the request is hashed EIP-712 style, but is not
    ///         itself signed as typed data).
    bytes32 public constant REQUEST_TYPEHASH = keccak256(
        "Request(bytes32 promptHash,uint64 seed,uint32 temperatureMicros,uint32 topK,uint32 topPMicros,uint32 maxTokens,bytes32 stopHash)"
    );

    /// @notice EIP-712 type hash of a referee's `Verdict`: it names the challenge by id and by what
    ///         was challenged, so after a reorg a verdict can't land on another challenge.
    bytes32 public constant VERDICT_TYPEHASH = keccak256(
        "Verdict(uint256 challengeId,bytes32 receiptDigest,uint32 position,address challenger,bool operatorAtFault)"
    );

    /// @notice Most stop tokens, stop sequences, and bytes in one stop sequence a stop rule holds.
    uint256 public constant MAX_STOP_TOKENS = 16;
    uint256 public constant MAX_STOP_SEQUENCES = 4;
    uint256 public constant MAX_STOP_SEQUENCE_BYTES = 64;

    /// @notice Denominator of `challengerRewardBps`.
    uint256 public constant BPS = 10_000;

    /// @notice Longest unbonding delay the constructor accepts (so `unbondAt` always fits uint48
    ///         and no configuration can lock a bond for good).
    uint256 public constant MAX_UNBONDING_DELAY = 5 * 365 days;

    /// @notice Longest referee-set delay the constructor accepts (so a proposal can't be parked
    ///         for good and `eta` always fits uint64).
    uint256 public constant MAX_REFEREE_SET_DELAY = 10 * 365 days;

    /// @notice Most referees one epoch may have, so a quorum check has bounded gas.
    uint256 public constant MAX_REFEREES = 32;

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
    /// @notice Seconds from `proposeRefereeSet` to the earliest `activateRefereeSet`;
    ///         always > unbondingDelay.
    uint256 public immutable refereeSetDelay;

    /*//////////////////////////////////////////////////////////////
                                 STATE
    //////////////////////////////////////////////////////////////*/

    mapping(address operator => Operator) internal _operators;
    mapping(uint256 id => ChallengeRecord) internal _challenges;
    /// @notice Id the next challenge gets; ids start at 1.
    uint256 public nextChallengeId = 1;
    /// @notice Pull-payment balances.
    mapping(address account => uint256) public credits;
    /// @notice Whether (operator, requestHash) has already been slashed for equivocation.
    mapping(address operator => mapping(bytes32 requestHash => bool)) public equivocationSlashed;
    /// @notice Whether a receipt (by EIP-712 digest) has already been slashed for a wrong token.
    mapping(bytes32 receiptDigest => bool) public receiptSlashed;

    /// @dev Epoch e's set at key e (for e <= refereeEpoch); a pending proposal at refereeEpoch + 1.
    mapping(uint256 epoch => RefereeSet) internal _refereeSets;
    /// @notice The current referee epoch (1 from the constructor on). New challenges snapshot it.
    uint64 public refereeEpoch;
    /// @dev When the pending proposal may be activated; 0 when there is none.
    uint64 internal _pendingEta;

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
    /// @notice Challenge `id` (opened at the answer's end, `position` = its length) says the answer
    ///         stopped early: before `maxTokens`, and not where `stop` ends it. Referees judge it.
    event EndChallenged(uint256 indexed id, StopRule stop);
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
    /// @notice The owner proposed the set `epoch` would be; it replaces any earlier proposal for
    ///         that epoch and can be activated from `eta` on.
    event RefereeSetProposed(uint256 indexed epoch, address[] members, uint256 threshold, uint256 eta);
    event RefereeSetCancelled(uint256 indexed epoch);
    /// @notice `epoch` is the current referee set from now on (epoch 1: from the constructor).
    event RefereeSetActivated(uint256 indexed epoch, address[] members, uint256 threshold);

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
    error RefereeSetDelayTooShort(uint256 refereeSetDelay, uint256 unbondingDelay);
    error RefereeSetDelayTooLong(uint256 refereeSetDelay, uint256 max);
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
    error StoreNoncesDiffer(uint64 storeNonceA, uint64 storeNonceB);
    error EquivocationAlreadySlashed(address operator, bytes32 requestHash);
    // challenges
    error WrongChallengerBond(uint256 sent, uint256 required);
    error ModelHashMismatch(bytes32 committed, bytes32 receipt);
    error RequestHashMismatch(bytes32 computed, bytes32 receipt);
    error OutputHashMismatch(bytes32 computed, bytes32 receipt);
    error TokenCountMismatch(uint256 outputLength, uint32 tokenCount);
    error PositionOutOfRange(uint32 position, uint256 outputLength);
    error StopHashMismatch(bytes32 computed, bytes32 committed);
    error StopRuleTooLarge(uint256 tokens, uint256 sequences, uint256 longestSequenceBytes);
    error AnswerReachedMaxTokens(uint256 outputLength, uint32 maxTokens);
    error EndedByStopToken(uint32 token);
    error ReceiptFromFuture(uint64 issuedAt, uint256 nowTs);
    error ChallengeWindowClosed(uint64 issuedAt, uint256 windowEnd, uint256 nowTs);
    error ReceiptAlreadySlashed(bytes32 receiptDigest);
    error ChallengeNotOpen(uint256 id, ChallengeStatus status);
    error ResolveWindowClosed(uint256 id, uint256 deadline, uint256 nowTs);
    error ResolveWindowNotClosed(uint256 id, uint256 deadline, uint256 nowTs);
    // referees
    error ZeroReferee();
    error DuplicateReferee(address referee);
    error TooManyReferees(uint256 count, uint256 max);
    error NotReferee(address account);
    error InvalidThreshold(uint256 threshold, uint256 refereeCount);
    error NoPendingRefereeSet();
    error RefereeSetNotReady(uint256 eta, uint256 nowTs);
    error SignersNotAscending(address previous, address signer);
    error BelowThreshold(uint256 signatures, uint256 threshold);
    // payouts
    error NothingToWithdraw(address account);
    error WithdrawFailed(address account, uint256 amount);

    /*//////////////////////////////////////////////////////////////
                              CONSTRUCTOR
    //////////////////////////////////////////////////////////////*/

    /// @param owner_ May propose (timelocked) and cancel referee sets, and nothing else: it can't
    ///        touch funds or decide a challenge.
    /// @param config Immutable parameters, validated here (see the `Config` fields).
    /// @param referees_ Epoch 1's referees (distinct, non-zero, at most MAX_REFEREES).
    /// @param threshold_ Epoch 1's verdict threshold, 0 < threshold_ <= referees_.length.
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
        // INVARIANT: an operator that requests unbonding when a referee set is proposed can
        //            withdraw its bond before that set can judge anything.
        if (config.refereeSetDelay <= config.unbondingDelay) {
            revert RefereeSetDelayTooShort(config.refereeSetDelay, config.unbondingDelay);
        }
        // INVARIANT: every proposal can be activated, and its eta fits uint64.
        if (config.refereeSetDelay > MAX_REFEREE_SET_DELAY) {
            revert RefereeSetDelayTooLong(config.refereeSetDelay, MAX_REFEREE_SET_DELAY);
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
        refereeSetDelay = config.refereeSetDelay;

        _writeRefereeSet(1, referees_, threshold_);
        refereeEpoch = 1;
        emit RefereeSetActivated(1, referees_, threshold_);
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
    ///      temperatureMicros, topK, topPMicros, maxTokens, stopHash)); every value is one 32-byte word.
    function hashRequest(uint32[] calldata prompt, SamplingParams calldata params) external pure returns (bytes32) {
        return _hashRequest(prompt, params);
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
                    RECEIPT_TYPEHASH,
                    r.operator,
                    r.modelHash,
                    r.requestHash,
                    r.outputHash,
                    r.tokenCount,
                    r.issuedAt,
                    r.storeNonce
                )
            )
        );
    }

    /// @notice The address that signed `r` (reverts on malformed or malleable (high-s) signatures).
    function receiptSigner(Receipt calldata r, bytes calldata sig) external view returns (address) {
        return ECDSA.recoverCalldata(receiptDigest(r), sig);
    }

    /// @notice The EIP-712 digest a referee signs for a verdict on challenge `challengeId`, which
    ///         must carry exactly this `receiptDigest`, `position` and `challenger` (see
    ///         `getChallenge`): a verdict can't be moved onto another challenge.
    /// @dev `receiptDigest_` is the typed field `receiptDigest` (underscored: the name is taken by
    ///      the function above).
    function verdictDigest(
        uint256 challengeId,
        bytes32 receiptDigest_,
        uint32 position,
        address challenger,
        bool operatorAtFault
    ) public view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(abi.encode(VERDICT_TYPEHASH, challengeId, receiptDigest_, position, challenger, operatorAtFault))
        );
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
        // INVARIANT: only one receipt store's own receipts can conflict (see Receipt.storeNonce).
        if (a.storeNonce != b.storeNonce) revert StoreNoncesDiffer(a.storeNonce, b.storeNonce);
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
    ///         `ChallengeOpened`, so referees can re-execute from the event alone. The challenge
    ///         snapshots the current `refereeEpoch`: that epoch's quorum decides it.
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
        _checkDisputedData(r, prompt, params, output);
        if (position >= output.length) revert PositionOutOfRange(position, output.length);
        id = _record(r.operator, digest, position);
        emit ChallengeOpened(id, r.operator, msg.sender, digest, r.modelHash, position, params, prompt, output);
    }

    /// @notice Challenges where a receipted answer ends: it stopped before `maxTokens` and not where
    ///         its stop rule ends it (issue: an operator that stops early and charges for the answer).
    ///         `stop` must be the rule the request committed to (`params.stopHash`). An answer that
    ///         reached `maxTokens`, or whose last token is a stop token, ended by the rule: refused
    ///         here. Whether its text completes a stop sequence is the referees' call (it needs the
    ///         tokenizer). Opened at position = the answer's length, posting `challengerBond`, and
    ///         resolved like any challenge.
    /// @return id The new challenge's id.
    function challengeEnd(
        Receipt calldata r,
        bytes calldata sig,
        uint32[] calldata prompt,
        SamplingParams calldata params,
        uint32[] calldata output,
        StopRule calldata stop
    ) external payable returns (uint256 id) {
        // INVARIANT: every challenge posts exactly challengerBond.
        if (msg.value != challengerBond) revert WrongChallengerBond(msg.value, challengerBond);
        bytes32 digest = _checkChallengeable(r, sig);
        _checkDisputedData(r, prompt, params, output);
        _checkEarlyEnd(params, output, stop);
        // output.length == r.tokenCount, a uint32 (_checkDisputedData)
        // forge-lint: disable-next-line(unsafe-typecast)
        id = _record(r.operator, digest, uint32(output.length));
        emit ChallengeOpened(
            id, r.operator, msg.sender, digest, r.modelHash, uint32(output.length), params, prompt, output
        );
        emit EndChallenged(id, stop);
    }

    /// @notice The hash a request's `stopHash` holds for `stop`: `keccak256(abi.encodePacked(tokens))`
    ///         when it has no sequences (as before stop sequences existed), else
    ///         `keccak256(abi.encode(that, keccak256(abi.encodePacked(keccak256(bytes(s)) for s))))`.
    function hashStopRule(StopRule calldata stop) public pure returns (bytes32) {
        bytes32 tokensHash = _hashTokens(stop.tokens);
        uint256 n = stop.sequences.length;
        if (n == 0) return tokensHash;
        bytes32[] memory each = new bytes32[](n);
        for (uint256 i; i < n; ++i) {
            each[i] = keccak256(bytes(stop.sequences[i]));
        }
        return keccak256(abi.encode(tokensHash, keccak256(abi.encodePacked(each))));
    }

    /// @notice Closes an open challenge with a referee quorum's verdict. Anyone may submit it.
    /// @param sigs EIP-712 `Verdict(id, receiptDigest, position, challenger, operatorAtFault)`
    ///        signatures (the challenge's own fields) of at least `thresholdAt(epoch)` distinct
    ///        referees of the challenge's `refereeEpoch`, ordered by strictly ascending signer address.
    function resolve(uint256 id, bool operatorAtFault, bytes[] calldata sigs) external {
        ChallengeRecord storage c = _challenges[id];
        if (c.status != ChallengeStatus.Open) revert ChallengeNotOpen(id, c.status);
        uint256 deadline = uint256(c.createdAt) + resolveTimeout;
        // INVARIANT: resolve and refundExpired partition time; a challenge closes exactly once.
        if (block.timestamp > deadline) revert ResolveWindowClosed(id, deadline, block.timestamp);
        address challenger = c.challenger;
        bytes32 digest = c.receiptDigest;
        // INVARIANT: no verdict without a quorum of distinct referees of the challenge's own epoch,
        //            signed over exactly what was challenged.
        _checkQuorum(
            _refereeSets[c.refereeEpoch], verdictDigest(id, digest, c.position, challenger, operatorAtFault), sigs
        );

        address operator = c.operator;
        uint256 bond = challengerBond;
        --_operators[operator].openChallenges;

        if (operatorAtFault) {
            c.status = ChallengeStatus.OperatorAtFault;
            uint256 slashed;
            // A receipt is slashed at most once, however many challenges name its positions.
            if (!receiptSlashed[digest]) {
                receiptSlashed[digest] = true;
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
        ChallengeRecord storage c = _challenges[id];
        if (c.status != ChallengeStatus.Open) revert ChallengeNotOpen(id, c.status);
        uint256 deadline = uint256(c.createdAt) + resolveTimeout;
        if (block.timestamp <= deadline) revert ResolveWindowNotClosed(id, deadline, block.timestamp);

        c.status = ChallengeStatus.Expired;
        --_operators[c.operator].openChallenges;
        emit ChallengeExpired(id, c.challenger, challengerBond);
        _credit(c.challenger, challengerBond);
    }

    /// @notice A challenge's record (all zero, status `None`, for an unused id).
    function getChallenge(uint256 id) external view returns (Challenge memory) {
        ChallengeRecord storage c = _challenges[id];
        return Challenge({
            challenger: c.challenger,
            // every challenge posted exactly challengerBond, which fits uint96 (constructor)
            // forge-lint: disable-next-line(unsafe-typecast)
            bond: c.status == ChallengeStatus.None ? 0 : uint96(challengerBond),
            operator: c.operator,
            createdAt: c.createdAt,
            position: c.position,
            status: c.status,
            receiptDigest: c.receiptDigest,
            refereeEpoch: c.refereeEpoch
        });
    }

    /*//////////////////////////////////////////////////////////////
                                REFEREES
    //////////////////////////////////////////////////////////////*/

    /// @notice Proposes the next referee epoch's set (owner only), replacing any pending proposal.
    ///         Anyone can activate it from `eta` on; it then decides the challenges opened after
    ///         its activation, never one already open.
    /// @param members Distinct, non-zero addresses, at most MAX_REFEREES.
    /// @param newThreshold Verdict threshold, 0 < newThreshold <= members.length.
    /// @return eta block.timestamp + refereeSetDelay.
    function proposeRefereeSet(address[] calldata members, uint256 newThreshold)
        external
        onlyOwner
        returns (uint256 eta)
    {
        uint256 epoch = uint256(refereeEpoch) + 1;
        if (_pendingEta != 0) _clearRefereeSet(epoch);
        _writeRefereeSet(epoch, members, newThreshold);
        // INVARIANT: no set judges anything before refereeSetDelay after it was proposed (a
        //            replacement restarts the delay).
        eta = block.timestamp + refereeSetDelay;
        _pendingEta = SafeCast.toUint64(eta);
        emit RefereeSetProposed(epoch, members, newThreshold, eta);
    }

    /// @notice Withdraws the pending proposal (owner only).
    function cancelRefereeSet() external onlyOwner {
        if (_pendingEta == 0) revert NoPendingRefereeSet();
        uint256 epoch = uint256(refereeEpoch) + 1;
        _clearRefereeSet(epoch);
        _pendingEta = 0;
        emit RefereeSetCancelled(epoch);
    }

    /// @notice Makes the pending proposal the current epoch, from its `eta` on. Anyone may call it.
    function activateRefereeSet() external {
        uint256 eta = _pendingEta;
        if (eta == 0) revert NoPendingRefereeSet();
        // INVARIANT: a proposed set takes effect only refereeSetDelay after its proposal.
        if (block.timestamp < eta) revert RefereeSetNotReady(eta, block.timestamp);
        uint64 epoch = refereeEpoch + 1;
        refereeEpoch = epoch;
        _pendingEta = 0;
        RefereeSet storage s = _refereeSets[epoch];
        emit RefereeSetActivated(epoch, s.members, s.threshold);
    }

    /// @notice The pending proposal: its members, threshold and eta (empty, 0 and 0 if none).
    function pendingRefereeSet() external view returns (address[] memory members, uint256 threshold_, uint256 eta) {
        eta = _pendingEta;
        if (eta == 0) return (members, 0, 0);
        RefereeSet storage s = _refereeSets[uint256(refereeEpoch) + 1];
        return (s.members, s.threshold, eta);
    }

    /// @notice Verdict signatures the current epoch needs (M of N); new challenges need this many.
    function threshold() external view returns (uint256) {
        return _refereeSets[refereeEpoch].threshold;
    }

    /// @notice Whether `account` is a referee of the current epoch.
    function isReferee(address account) external view returns (bool) {
        return _refereeSets[refereeEpoch].isMember[account];
    }

    /// @notice Number of referees (N) of the current epoch.
    function refereeCount() external view returns (uint256) {
        return _refereeSets[refereeEpoch].members.length;
    }

    /// @notice The current epoch's referees, in the order they were proposed.
    function referees() external view returns (address[] memory) {
        return _refereeSets[refereeEpoch].members;
    }

    /// @notice Epoch `epoch`'s referees (empty for 0 and for epochs not yet activated).
    function refereesAt(uint256 epoch) external view returns (address[] memory) {
        if (epoch > refereeEpoch) return new address[](0);
        return _refereeSets[epoch].members;
    }

    /// @notice Epoch `epoch`'s verdict threshold (0 for 0 and for epochs not yet activated).
    function thresholdAt(uint256 epoch) external view returns (uint256) {
        if (epoch > refereeEpoch) return 0;
        return _refereeSets[epoch].threshold;
    }

    /// @notice Whether `account` is a referee of epoch `epoch` (false for epochs not yet activated).
    function isRefereeAt(uint256 epoch, address account) external view returns (bool) {
        if (epoch > refereeEpoch) return false;
        return _refereeSets[epoch].isMember[account];
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
                REQUEST_TYPEHASH,
                _hashTokens(prompt),
                p.seed,
                p.temperatureMicros,
                p.topK,
                p.topPMicros,
                p.maxTokens,
                p.stopHash
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
        uint32[] calldata output
    ) internal pure {
        bytes32 requestHash = _hashRequest(prompt, params);
        if (requestHash != r.requestHash) revert RequestHashMismatch(requestHash, r.requestHash);
        bytes32 outputHash = _hashTokens(output);
        if (outputHash != r.outputHash) revert OutputHashMismatch(outputHash, r.outputHash);
        if (output.length != r.tokenCount) revert TokenCountMismatch(output.length, r.tokenCount);
    }

    /// @dev An end challenge names the committed stop rule, and an answer the rule cannot have ended.
    function _checkEarlyEnd(SamplingParams calldata params, uint32[] calldata output, StopRule calldata stop)
        internal
        pure
    {
        uint256 longest;
        for (uint256 i; i < stop.sequences.length; ++i) {
            uint256 len = bytes(stop.sequences[i]).length;
            if (len > longest) longest = len;
        }
        if (
            stop.tokens.length > MAX_STOP_TOKENS || stop.sequences.length > MAX_STOP_SEQUENCES
                || longest > MAX_STOP_SEQUENCE_BYTES
        ) revert StopRuleTooLarge(stop.tokens.length, stop.sequences.length, longest);
        bytes32 computed = hashStopRule(stop);
        if (computed != params.stopHash) revert StopHashMismatch(computed, params.stopHash);
        // INVARIANT: an answer that ran to maxTokens ended by the rule, however its text ends.
        if (output.length >= params.maxTokens) revert AnswerReachedMaxTokens(output.length, params.maxTokens);
        if (output.length == 0) return; // nothing emitted before maxTokens: only the referees' re-execution can say
        uint32 last = output[output.length - 1];
        for (uint256 i; i < stop.tokens.length; ++i) {
            // INVARIANT: an answer whose last token is a stop token ended by the rule.
            if (stop.tokens[i] == last) revert EndedByStopToken(last);
        }
    }

    /// @dev Stores an open challenge of `operator`'s receipt `digest` at `position`.
    function _record(address operator, bytes32 digest, uint32 position) internal returns (uint256 id) {
        id = nextChallengeId++;
        // The bond is not stored: it is msg.value == challengerBond, an immutable.
        _challenges[id] = ChallengeRecord({
            challenger: msg.sender,
            refereeEpoch: refereeEpoch,
            operator: operator,
            createdAt: uint48(block.timestamp),
            position: position,
            status: ChallengeStatus.Open,
            receiptDigest: digest
        });
        ++_operators[operator].openChallenges;
    }

    /// @dev Reverts unless `sigs` hold >= set.threshold signatures of `digest` by distinct
    ///      members of `set`, in strictly ascending signer order.
    function _checkQuorum(RefereeSet storage set, bytes32 digest, bytes[] calldata sigs) internal view {
        uint256 m = set.threshold; // > 0: every activated epoch has 0 < threshold <= members
        if (sigs.length < m) revert BelowThreshold(sigs.length, m);
        address previous;
        for (uint256 i; i < sigs.length; ++i) {
            address signer = ECDSA.recoverCalldata(digest, sigs[i]);
            // INVARIANT: strictly ascending signers, so no referee counts twice.
            if (signer <= previous) revert SignersNotAscending(previous, signer);
            if (!set.isMember[signer]) revert NotReferee(signer);
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

    /// @dev Validates a referee set and writes it into the (empty) slot of `epoch`.
    function _writeRefereeSet(uint256 epoch, address[] memory members, uint256 threshold_) internal {
        uint256 n = members.length;
        // INVARIANT: at most MAX_REFEREES, so quorum checks and set changes have bounded gas.
        if (n > MAX_REFEREES) revert TooManyReferees(n, MAX_REFEREES);
        // INVARIANT: 0 < threshold <= members, so an empty signature list never resolves and a
        //            quorum is always reachable.
        if (threshold_ == 0 || threshold_ > n) revert InvalidThreshold(threshold_, n);
        RefereeSet storage set = _refereeSets[epoch];
        for (uint256 i; i < n; ++i) {
            address member = members[i];
            if (member == address(0)) revert ZeroReferee();
            if (set.isMember[member]) revert DuplicateReferee(member);
            set.isMember[member] = true;
            set.members.push(member);
        }
        set.threshold = threshold_;
    }

    /// @dev Empties the slot of `epoch` (a pending proposal being replaced or cancelled).
    function _clearRefereeSet(uint256 epoch) internal {
        RefereeSet storage set = _refereeSets[epoch];
        address[] storage members = set.members;
        for (uint256 i; i < members.length; ++i) {
            delete set.isMember[members[i]];
        }
        delete set.members;
        delete set.threshold;
    }
}
