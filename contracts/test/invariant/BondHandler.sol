// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {BondHelpers} from "../utils/BondFixture.sol";
import {TestUtils} from "../utils/TestBase.sol";
import {SpecmarketBond} from "../../src/SpecmarketBond.sol";

/// @dev Drives SpecmarketBond through random sequences of every user action, with real operator
///      and referee signatures and deliberately bad ones, and the owner's referee-set proposals,
///      cancellations and activations; keeps ghost accounting (bonds, referee epochs) to check it.
contract BondHandler is BondHelpers {
    SpecmarketBond public immutable bond;
    address public immutable owner;
    address public immutable treasury;

    uint256[] internal opPks;
    address[] public operators;
    address[] public challengers;
    uint256[] internal poolPks; // every key a referee set is drawn from, sorted by address
    address[] internal poolAddrs; // their addresses, same order
    uint256 internal constant OUTSIDER_PK = 0x0BAD;
    uint256 internal constant MAX_REFEREES = 32;

    uint256[] public challengeIds;
    /// The last receipt challenged successfully: about one challenge in three piles onto it at
    /// another position, so that receipts get found at fault more than once.
    uint256 internal lastOpIndex;
    uint256 internal lastDataSeed;
    uint64 internal lastIssuedAt;
    bool internal haveLast;

    // ---- ghost state ----------------------------------------------------------------------
    /// Bond each operator should hold, updated only by deposits and by slashes the handler
    /// itself proved (a valid referee quorum or a valid equivocation pair).
    mapping(address => uint256) public ghostBond;
    mapping(address => mapping(bytes32 => bool)) internal ghostEquivocated;
    mapping(bytes32 => bool) internal ghostReceiptSlashed;
    uint256 public ghostDeposited;
    uint256 public ghostPaidOut;
    /// Calls that succeeded although they must not have (each must stay 0).
    uint256 public ghostBadResolveAccepted;
    uint256 public ghostBadEquivocationAccepted;
    uint256 public ghostEarlyBondWithdrawal;
    /// Calls that reverted although they must have succeeded (each must stay 0).
    uint256 public ghostValidCallRejected;
    /// How often the interesting paths ran, for the run's summary.
    uint256 public slashesByQuorum;
    uint256 public slashesByEquivocation;
    uint256 public bondWithdrawals;
    uint256 public refunds;
    uint256 public clearedChallenges;
    uint256 public repeatFaults; // at-fault verdicts on a receipt that was already slashed
    uint256 public badResolvesRejected;

    // ---- ghost referee epochs ---------------------------------------------------------------
    /// Epochs activated so far (1: the constructor's), and each one's keys (ascending by address)
    /// and threshold, as the handler proposed them.
    uint256 public ghostEpoch;
    mapping(uint256 epoch => uint256[]) internal epochPks;
    mapping(uint256 epoch => uint256) public epochThreshold;
    mapping(uint256 epoch => uint256) public epochProposedAt;
    mapping(uint256 epoch => uint256) public epochActivatedAt;
    /// The pending proposal, if any.
    bool public havePending;
    uint256[] internal pendingPks;
    uint256 public pendingThreshold;
    uint256 public pendingProposedAt;
    /// The epoch current when the handler opened each challenge, and the epoch whose valid
    /// quorum (by the handler's own oracle) closed it with a verdict (0: none).
    mapping(uint256 id => uint256) public ghostChallengeEpoch;
    mapping(uint256 id => uint256) public ghostVerdictEpoch;
    /// Must stay 0: an activation before refereeSetDelay had passed since its proposal; a
    /// challenge that snapshotted another epoch than the current one.
    uint256 public ghostEarlyActivation;
    uint256 public ghostEpochMismatch;
    uint256 public proposals;
    uint256 public replacedProposals;
    uint256 public cancellations;
    uint256 public activations;
    uint256 public staleEpochResolves; // a challenge decided by its epoch after a newer one activated
    uint256 public endChallenges; // end challenges opened (challengeEnd)
    uint256 public otherEpochQuorumsRejected;

    /// `poolPks_` sorted by address; epoch 1 (the bond's constructor set) is its first `n1` keys
    /// with threshold `threshold1`.
    constructor(SpecmarketBond bond_, address owner_, uint256[] memory poolPks_, uint256 n1, uint256 threshold1) {
        bond = bond_;
        owner = owner_;
        treasury = bond_.treasury();
        for (uint256 i; i < poolPks_.length; ++i) {
            poolPks.push(poolPks_[i]);
            poolAddrs.push(vm.addr(poolPks_[i]));
            if (i < n1) epochPks[1].push(poolPks_[i]);
        }
        ghostEpoch = 1;
        epochThreshold[1] = threshold1;
        for (uint256 i; i < 3; ++i) {
            uint256 pk = 0xB000 + i;
            opPks.push(pk);
            operators.push(vm.addr(pk));
            challengers.push(address(uint160(0xC000 + i)));
        }
    }

    // ---- views for the invariants ----------------------------------------------------------

    function operatorCount() external view returns (uint256) {
        return operators.length;
    }

    function challengeCount() external view returns (uint256) {
        return challengeIds.length;
    }

    /// Epoch `e`'s referee addresses as the handler proposed them (ascending).
    function epochMembers(uint256 e) public returns (address[] memory a) {
        uint256[] memory pks = epochPks[e];
        a = new address[](pks.length);
        for (uint256 i; i < pks.length; ++i) {
            a[i] = vm.addr(pks[i]);
        }
    }

    function pendingMembers() external returns (address[] memory a) {
        a = new address[](pendingPks.length);
        for (uint256 i; i < pendingPks.length; ++i) {
            a[i] = vm.addr(pendingPks[i]);
        }
    }

    /// Every address that can hold a credit: operators, challengers (also the reporters) and the treasury.
    function actors() public view returns (address[] memory a) {
        a = new address[](operators.length + challengers.length + 1);
        uint256 k;
        for (uint256 i; i < operators.length; ++i) {
            a[k++] = operators[i];
        }
        for (uint256 i; i < challengers.length; ++i) {
            a[k++] = challengers[i];
        }
        a[k] = treasury;
    }

    // ---- helpers ---------------------------------------------------------------------------

    function _model(address op) internal pure returns (bytes32) {
        return keccak256(abi.encode("model", op));
    }

    function _info(address op)
        internal
        view
        returns (bool registered, uint256 bondAmt, uint256 unbondAt, uint256 open)
    {
        (registered,,, bondAmt, unbondAt, open) = bond.operatorInfo(op);
    }

    function _min(uint256 a, uint256 b) internal pure returns (uint256) {
        return a < b ? a : b;
    }

    /// Applies a proven slash to the ghost bond.
    function _ghostSlash(address op) internal {
        ghostBond[op] -= _min(bond.slashAmount(), ghostBond[op]);
    }

    // ---- actions ---------------------------------------------------------------------------

    function register(uint256 opSeed, uint256 amount) external {
        address op = operators[opSeed % operators.length];
        amount = bound(amount, bond.minBond(), 10 ether);
        (bool registered,,,) = _info(op);
        vm.deal(op, amount);
        vm.prank(op);
        try bond.register{value: amount}(_model(op)) {
            ghostBond[op] = amount;
            ghostDeposited += amount;
        } catch {
            if (!registered) ++ghostValidCallRejected;
        }
    }

    function topUp(uint256 opSeed, uint256 amount) external {
        address op = operators[opSeed % operators.length];
        amount = bound(amount, 1, 5 ether);
        (bool registered,,,) = _info(op);
        vm.deal(op, amount);
        vm.prank(op);
        try bond.topUp{value: amount}() {
            ghostBond[op] += amount;
            ghostDeposited += amount;
        } catch {
            if (registered) ++ghostValidCallRejected;
        }
    }

    function requestUnbond(uint256 opSeed) external {
        address op = operators[opSeed % operators.length];
        (bool registered,, uint256 unbondAt,) = _info(op);
        vm.prank(op);
        try bond.requestUnbond() {}
        catch {
            if (registered && unbondAt == 0) ++ghostValidCallRejected;
        }
    }

    /// Half of the time like a careful leaving operator: first refunds its own expired challenges
    /// (only timely ones can still block it); otherwise tries with whatever is still open. Three
    /// calls in four go to an operator past its `unbondAt` if there is one (scanning from a random
    /// index), so that withdrawals meet open challenges.
    function withdrawBond(uint256 opSeed) external {
        uint256 k = opSeed % operators.length;
        for (uint256 i; i < operators.length && (opSeed >> 64) % 4 != 0; ++i) {
            (bool candidateRegistered,, uint256 candidateUnbondAt,) = _info(operators[(k + i) % operators.length]);
            if (candidateRegistered && candidateUnbondAt != 0 && block.timestamp >= candidateUnbondAt) {
                k = (k + i) % operators.length;
                break;
            }
        }
        address op = operators[k];
        for (uint256 i; i < challengeIds.length && (opSeed >> 128) % 2 == 0; ++i) {
            SpecmarketBond.Challenge memory c = bond.getChallenge(challengeIds[i]);
            if (
                c.operator == op && c.status == SpecmarketBond.ChallengeStatus.Open
                    && block.timestamp > uint256(c.createdAt) + bond.resolveTimeout()
            ) {
                bond.refundExpired(challengeIds[i]);
                ++refunds;
            }
        }
        (bool registered, uint256 bondAmt, uint256 unbondAt, uint256 open) = _info(op);
        bool allowed = registered && unbondAt != 0 && block.timestamp >= unbondAt && open == 0;
        uint256 creditBefore = bond.credits(op);
        vm.prank(op);
        try bond.withdrawBond() {
            if (!allowed) ++ghostEarlyBondWithdrawal;
            if (bond.credits(op) != creditBefore + bondAmt) ++ghostEarlyBondWithdrawal;
            ghostBond[op] = 0;
            ++bondWithdrawals;
        } catch {
            if (allowed) ++ghostValidCallRejected;
        }
    }

    function challenge(uint256 opSeed, uint256 chSeed, uint256 issuedBack, uint256 dataSeed, uint256 posSeed) external {
        uint256 k = opSeed % operators.length;
        uint64 issuedAt;
        if (haveLast && posSeed % 3 == 0) {
            // pile onto the last challenged receipt (it may have left its window by now)
            (k, dataSeed, issuedAt) = (lastOpIndex, lastDataSeed, lastIssuedAt);
            posSeed >>= 2;
        } else {
            issuedBack = bound(issuedBack, 0, bond.challengeWindow());
            if (issuedBack > block.timestamp) issuedBack = block.timestamp;
            issuedAt = uint64(block.timestamp - issuedBack);
        }
        if (_challenge(k, challengers[chSeed % challengers.length], dataSeed, issuedAt, posSeed)) {
            (lastOpIndex, lastDataSeed, lastIssuedAt, haveLast) = (k, dataSeed, issuedAt, true);
        }
    }

    /// An end challenge (`challengeEnd`): every claim's output is shorter than its maxTokens and
    /// its stop rule is empty, so it opens wherever a wrong-token challenge would; a third of the
    /// calls name another stop rule, which must be refused.
    function challengeEnd(uint256 opSeed, uint256 chSeed, uint256 issuedBack, uint256 dataSeed) external {
        uint256 k = opSeed % operators.length;
        issuedBack = bound(issuedBack, 0, bond.challengeWindow());
        if (issuedBack > block.timestamp) issuedBack = block.timestamp;
        Claim memory c = _claim(k, dataSeed, uint64(block.timestamp - issuedBack));
        SpecmarketBond.StopRule memory stop;
        bool otherRule = dataSeed % 3 == 0;
        if (otherRule) stop.tokens = TestUtils.tokens(dataSeed, 1);
        (bool registered,,,) = _info(operators[k]);
        bool expectOk = registered && !otherRule && block.timestamp <= uint256(c.r.issuedAt) + bond.challengeWindow()
            && !ghostReceiptSlashed[bond.receiptDigest(c.r)];
        address ch = challengers[chSeed % challengers.length];
        uint256 cb = bond.challengerBond();
        vm.deal(ch, cb);
        vm.prank(ch);
        try bond.challengeEnd{value: cb}(c.r, c.sig, c.prompt, c.params, c.output, stop) returns (uint256 id) {
            challengeIds.push(id);
            ghostDeposited += cb;
            ++endChallenges;
            if (!expectOk) ++ghostValidCallRejected; // accepted what it had to refuse
            ghostChallengeEpoch[id] = ghostEpoch;
            if (bond.getChallenge(id).refereeEpoch != ghostEpoch) ++ghostEpochMismatch;
        } catch {
            if (expectOk) ++ghostValidCallRejected;
        }
    }

    /// A receipted answer and everything `challenge` takes with it.
    struct Claim {
        SpecmarketBond.Receipt r;
        bytes sig;
        uint32[] prompt;
        SpecmarketBond.SamplingParams params;
        uint32[] output;
    }

    /// Operator k's signed receipt for the request and output that `dataSeed` determines.
    function _claim(uint256 k, uint256 dataSeed, uint64 issuedAt) internal returns (Claim memory c) {
        address op = operators[k];
        c.prompt = TestUtils.tokens(dataSeed, 1 + dataSeed % 6);
        c.output = TestUtils.tokens(dataSeed >> 8, 1 + (dataSeed >> 16) % 8);
        c.params = _params(uint64(dataSeed % 3));
        c.r = _receipt(op, _model(op), c.prompt, c.params, c.output, issuedAt);
        c.sig = TestUtils.sign(opPks[k], bond.receiptDigest(c.r));
    }

    function _challenge(uint256 k, address ch, uint256 dataSeed, uint64 issuedAt, uint256 posSeed)
        internal
        returns (bool opened)
    {
        Claim memory c = _claim(k, dataSeed, issuedAt);
        (bool registered,,,) = _info(operators[k]);
        bool expectOk = registered && block.timestamp <= uint256(issuedAt) + bond.challengeWindow()
            && !ghostReceiptSlashed[bond.receiptDigest(c.r)];
        uint256 cb = bond.challengerBond();
        vm.deal(ch, cb);
        vm.prank(ch);
        try bond.challenge{value: cb}(
            c.r, c.sig, c.prompt, c.params, c.output, uint32(posSeed % c.output.length)
        ) returns (
            uint256 id
        ) {
            challengeIds.push(id);
            ghostDeposited += cb;
            opened = true;
            if (!expectOk) ++ghostValidCallRejected; // accepted what it had to refuse
            ghostChallengeEpoch[id] = ghostEpoch;
            if (bond.getChallenge(id).refereeEpoch != ghostEpoch) ++ghostEpochMismatch;
        } catch {
            if (expectOk) ++ghostValidCallRejected;
        }
    }

    /// What a set of verdict signatures was signed over.
    struct Signed {
        uint256 id;
        bytes32 receiptDigest;
        uint32 position;
        address challenger;
        bool fault;
    }

    /// mode 0: a valid quorum (a random subset of at least M referees of the challenge's epoch,
    /// ascending); 1: below threshold; 2: a repeated signer; 3: an outsider in the set;
    /// 4: descending order; 5: a quorum that signed the opposite verdict; 6: a quorum that signed
    /// another challenge's id, receipt digest, position or challenger; 7: a quorum of another
    /// epoch. Whether the set must be accepted is decided by the handler's own oracle
    /// (`_isQuorum` over its ghost epochs, and the signed fields), not by the mode.
    function resolve(uint256 idSeed, bool fault, uint256 mode, uint256 subsetSeed) external {
        if (challengeIds.length == 0) return;
        uint256 id = _pickChallenge(idSeed, true);
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        mode = mode % 16;
        if (mode > 7) mode = 0; // half of the attempts carry a valid quorum
        uint256 e = ghostChallengeEpoch[id];
        Signed memory v = Signed(id, c.receiptDigest, c.position, c.challenger, fault);
        uint256[] memory pks = _signers(e, mode, subsetSeed);
        if (mode == 5) v.fault = !fault;
        if (mode == 6) _mismatch(v, subsetSeed);
        bytes[] memory sigs =
            _signDigest(bond.verdictDigest(v.id, v.receiptDigest, v.position, v.challenger, v.fault), pks);
        bool valid = mode < 5 || mode == 7 ? _isQuorum(pks, e) : false;

        bool timely = block.timestamp <= uint256(c.createdAt) + bond.resolveTimeout();
        bool open = c.status == SpecmarketBond.ChallengeStatus.Open;
        try bond.resolve(id, fault, sigs) {
            if (!valid) {
                ++ghostBadResolveAccepted;
                return;
            }
            if (!open || !timely) ++ghostValidCallRejected; // accepted what it had to refuse
            _recordVerdict(id, c, e, fault, subsetSeed);
        } catch {
            if (valid && open && timely) ++ghostValidCallRejected;
            if (!valid && open && timely) {
                ++badResolvesRejected;
                if (mode == 7) ++otherEpochQuorumsRejected;
            }
        }
    }

    /// The ghost effects of a verdict by a valid quorum of epoch `e` on challenge `id` (`c`).
    function _recordVerdict(uint256 id, SpecmarketBond.Challenge memory c, uint256 e, bool fault, uint256 seed)
        internal
    {
        ghostVerdictEpoch[id] = e;
        if (e < ghostEpoch) ++staleEpochResolves;
        if (!fault) ++clearedChallenges;
        if (fault && !ghostReceiptSlashed[c.receiptDigest]) {
            ghostReceiptSlashed[c.receiptDigest] = true;
            _ghostSlash(c.operator);
            ++slashesByQuorum;
            _resolvePileOn(id, c.receiptDigest, seed);
        } else if (fault) {
            ++repeatFaults; // the challenger gets its bond back; the bond is not slashed again
        }
    }

    /// Right after an activation, one open, resolvable challenge of an older epoch (if any) is
    /// tried with a quorum of the new epoch (refused unless it is also a quorum of the
    /// challenge's own epoch), then with a quorum of its own epoch (accepted).
    function _resolveStale(uint256 seed) internal {
        for (uint256 i; i < challengeIds.length; ++i) {
            uint256 id = challengeIds[i];
            SpecmarketBond.Challenge memory c = bond.getChallenge(id);
            uint256 e = ghostChallengeEpoch[id];
            bool open = c.status == SpecmarketBond.ChallengeStatus.Open;
            if (!open || e == ghostEpoch || block.timestamp > uint256(c.createdAt) + bond.resolveTimeout()) continue;
            bool fault = seed % 2 == 0;
            uint256[] memory pks = _subset(epochPks[ghostEpoch], epochThreshold[ghostEpoch], seed >> 1);
            bool valid = _isQuorum(pks, e);
            try bond.resolve(id, fault, _verdictSigs(bond, id, fault, pks)) {
                if (valid) _recordVerdict(id, c, e, fault, seed);
                else ++ghostBadResolveAccepted;
                return;
            } catch {
                if (valid) ++ghostValidCallRejected;
                else ++otherEpochQuorumsRejected;
            }
            pks = _subset(epochPks[e], epochThreshold[e], seed >> 8);
            try bond.resolve(id, fault, _verdictSigs(bond, id, fault, pks)) {
                _recordVerdict(id, c, e, fault, seed);
            } catch {
                ++ghostValidCallRejected;
            }
            return;
        }
    }

    /// The signer keys of a `resolve` attempt in `mode` (see there) on a challenge of epoch `e`.
    function _signers(uint256 e, uint256 mode, uint256 seed) internal returns (uint256[] memory pks) {
        uint256[] memory set = epochPks[e];
        uint256 m = epochThreshold[e];
        if (mode == 0 || mode == 5 || mode == 6) return _subset(set, m, seed);
        if (mode == 1) return _prefix(set, m - 1);
        if (mode == 2) {
            pks = new uint256[](m + 1);
            for (uint256 i; i < m; ++i) {
                pks[i] = set[i];
            }
            pks[m] = set[m - 1]; // repeated at the end: not strictly ascending
            return pks;
        }
        if (mode == 3) {
            // a pool key outside this epoch (maybe a member of another epoch or of a cancelled
            // proposal), or a key that was never in any set
            pks = _prefix(set, m);
            pks[m - 1] = OUTSIDER_PK;
            for (uint256 i; i < poolPks.length && seed % 2 == 0; ++i) {
                uint256 k = poolPks[(seed / 2 + i) % poolPks.length];
                if (!_inSet(set, k)) {
                    pks[m - 1] = k;
                    break;
                }
            }
            return TestUtils.sortByAddress(pks);
        }
        if (mode == 4) {
            if (m == 1) {
                pks = new uint256[](2);
                (pks[0], pks[1]) = (set[0], set[0]);
                return pks;
            }
            pks = _prefix(set, m);
            for (uint256 i; i < m / 2; ++i) {
                (pks[i], pks[m - 1 - i]) = (pks[m - 1 - i], pks[i]);
            }
            return pks;
        }
        // mode 7: a quorum of another epoch (of this one if it is the only epoch)
        uint256 other = 1 + seed % ghostEpoch;
        if (other == e) other = e % ghostEpoch + 1;
        return _subset(epochPks[other], epochThreshold[other], seed >> 8);
    }

    /// Changes one of the verdict's fields: the id, the receipt digest, the position or the challenger.
    function _mismatch(Signed memory v, uint256 seed) internal pure {
        uint256 which = (seed >> 16) % 4;
        if (which == 0) v.id += 1 + seed % 3;
        else if (which == 1) v.receiptDigest = bytes32(uint256(v.receiptDigest) ^ (1 + seed % 255));
        else if (which == 2) v.position += uint32(1 + seed % 7); // wraps at 2^32: still another position
        else v.challenger = address(uint160(v.challenger) ^ uint160(1 + seed % 255));
    }

    /// The oracle: `pks` are strictly ascending by address, all referees of ghost epoch `e`, and at
    /// least its threshold.
    function _isQuorum(uint256[] memory pks, uint256 e) internal returns (bool) {
        if (pks.length < epochThreshold[e]) return false;
        uint256[] memory set = epochPks[e];
        address previous;
        for (uint256 i; i < pks.length; ++i) {
            address a = vm.addr(pks[i]);
            if (a <= previous) return false;
            if (!_inSet(set, pks[i])) return false;
            previous = a;
        }
        return true;
    }

    function _inSet(uint256[] memory set, uint256 pk) internal pure returns (bool) {
        for (uint256 j; j < set.length; ++j) {
            if (set[j] == pk) return true;
        }
        return false;
    }

    /// Whether pool address `a` is a member of ghost epoch `e`.
    function ghostIsMember(uint256 e, address a) external returns (bool) {
        uint256[] memory set = epochPks[e];
        for (uint256 j; j < set.length; ++j) {
            if (vm.addr(set[j]) == a) return true;
        }
        return false;
    }

    function poolSize() external view returns (uint256) {
        return poolAddrs.length;
    }

    function poolAddr(uint256 i) external view returns (address) {
        return poolAddrs[i];
    }

    /// Right after a receipt is found at fault, a valid quorum of its own epoch finds another open
    /// challenge on the same receipt (a pile-on) at fault too: that challenger is refunded, the
    /// bond is not slashed again (the ghost bond doesn't move).
    function _resolvePileOn(uint256 id, bytes32 digest, uint256 subsetSeed) internal {
        for (uint256 i; i < challengeIds.length; ++i) {
            uint256 other = challengeIds[i];
            SpecmarketBond.Challenge memory c = bond.getChallenge(other);
            if (other == id || c.receiptDigest != digest || c.status != SpecmarketBond.ChallengeStatus.Open) continue;
            if (block.timestamp > uint256(c.createdAt) + bond.resolveTimeout()) continue;
            uint256 e = ghostChallengeEpoch[other];
            uint256[] memory pks = _subset(epochPks[e], epochThreshold[e], subsetSeed);
            try bond.resolve(other, true, _verdictSigs(bond, other, true, pks)) {
                ++repeatFaults;
                ghostVerdictEpoch[other] = e;
                if (e < ghostEpoch) ++staleEpochResolves;
            } catch {
                ++ghostValidCallRejected;
            }
            return;
        }
    }

    function refundExpired(uint256 idSeed) external {
        if (challengeIds.length == 0) return;
        uint256 id = _pickChallenge(idSeed, false);
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        bool allowed = c.status == SpecmarketBond.ChallengeStatus.Open
            && block.timestamp > uint256(c.createdAt) + bond.resolveTimeout();
        try bond.refundExpired(id) {
            if (!allowed) ++ghostValidCallRejected;
            ++refunds;
        } catch {
            if (allowed) ++ghostValidCallRejected;
        }
    }

    /// mode 0: a valid pair; 1: the same output twice; 2: one receipt signed by another key;
    /// 3: the pair's operators differ.
    function slashEquivocation(uint256 opSeed, uint256 reporterSeed, uint256 mode, uint256 reqSeed) external {
        uint256 k = opSeed % operators.length;
        address op = operators[k];
        mode = mode % 4;
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb) =
            _equivPair(k, mode, reqSeed);
        (bool registered,,,) = _info(op);
        bool valid = mode == 0 && registered && !ghostEquivocated[op][a.requestHash];
        vm.prank(challengers[reporterSeed % challengers.length]);
        try bond.slashEquivocation(a, sa, b, sb) {
            if (!valid) {
                ++ghostBadEquivocationAccepted;
                return;
            }
            ghostEquivocated[op][a.requestHash] = true;
            _ghostSlash(op);
            ++slashesByEquivocation;
        } catch {
            if (valid) ++ghostValidCallRejected;
            return;
        }
        // the same proof again, the other way round, must not slash a second time
        try bond.slashEquivocation(b, sb, a, sa) {
            ++ghostBadEquivocationAccepted;
        } catch {}
    }

    function _equivPair(uint256 k, uint256 mode, uint256 reqSeed)
        internal
        returns (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb)
    {
        address op = operators[k];
        uint32[] memory p = TestUtils.tokens(reqSeed % 4, 3); // few requests, so repeats get tried
        SpecmarketBond.SamplingParams memory sp = _params(7);
        a = _receipt(op, _model(op), p, sp, TestUtils.tokens(1000, 2), uint64(block.timestamp));
        b = _receipt(op, _model(op), p, sp, TestUtils.tokens(mode == 1 ? 1000 : 1001, 2), uint64(block.timestamp));
        uint256 other = (k + 1) % opPks.length;
        uint256 signerB = mode >= 2 ? opPks[other] : opPks[k];
        if (mode == 3) b.operator = operators[other];
        sa = TestUtils.sign(opPks[k], bond.receiptDigest(a));
        sb = TestUtils.sign(signerB, bond.receiptDigest(b));
    }

    function withdraw(uint256 actorSeed) external {
        address[] memory a = actors();
        address who = a[actorSeed % a.length];
        uint256 credit = bond.credits(who);
        uint256 before = who.balance;
        vm.prank(who);
        try bond.withdraw() {
            ghostPaidOut += credit;
            if (who.balance != before + credit) ++ghostValidCallRejected;
        } catch {
            if (credit != 0) ++ghostValidCallRejected;
        }
    }

    function warp(uint256 dt) external {
        // one warp in four lands on the next deadline, so that boundaries get hit exactly
        uint256 next = (dt >> 8) % 4 == 0 ? _nextDeadline(dt >> 16) : 0;
        if (next != 0) {
            vm.warp(next);
            return;
        }
        // 1/8 to 1/2 of the unbonding delay: every deadline gets crossed within a run
        dt = (1 + dt % 4) * (bond.unbondingDelay() / 8);
        vm.warp(block.timestamp + dt);
    }

    /// The earliest deadline still ahead (0 if none): an operator's `unbondAt`, an open
    /// challenge's last resolvable second (`+ 1` for odd `seed`: its first refundable second), or
    /// the pending referee set's eta (`- 1` for odd `seed`: its last second not yet activatable).
    function _nextDeadline(uint256 seed) internal view returns (uint256 next) {
        if (havePending) {
            uint256 eta = pendingProposedAt + bond.refereeSetDelay() - seed % 2;
            if (eta > block.timestamp) next = eta;
        }
        for (uint256 i; i < operators.length; ++i) {
            (,, uint256 unbondAt,) = _info(operators[i]);
            if (unbondAt > block.timestamp && (next == 0 || unbondAt < next)) next = unbondAt;
        }
        for (uint256 i; i < challengeIds.length; ++i) {
            SpecmarketBond.Challenge memory c = bond.getChallenge(challengeIds[i]);
            uint256 d = uint256(c.createdAt) + bond.resolveTimeout() + seed % 2;
            if (c.status == SpecmarketBond.ChallengeStatus.Open && d > block.timestamp && (next == 0 || d < next)) {
                next = d;
            }
        }
    }

    // ---- referee sets (the owner proposes and cancels; anyone activates) ------------------------

    /// The owner proposes a set of pool keys chosen by `seed`; kinds 0-4 of `(seed >> 128) % 16`
    /// are invalid (threshold 0, threshold above the count, a repeated member, the zero address,
    /// more than MAX_REFEREES members), the rest valid. While a proposal is pending, one call in
    /// two leaves it alone, so proposals live long enough to be activated.
    function proposeRefereeSet(uint256 seed) external {
        seed = uint256(keccak256(abi.encode(seed))); // the fuzzer's dictionary values are mostly small
        if (havePending && seed % 2 != 0) return;
        uint256[] memory pks = _subset(poolPks, 1, seed >> 8);
        uint256 n = pks.length;
        uint256 t = 1 + (seed >> 64) % n;
        uint256 kind = (seed >> 128) % 16;
        address[] memory members = new address[](kind == 2 || kind == 3 ? n + 1 : kind == 4 ? MAX_REFEREES + 1 : n);
        for (uint256 i; i < members.length; ++i) {
            members[i] = i < n ? vm.addr(pks[i]) : address(uint160(0xF000 + i));
        }
        if (kind == 0) t = 0;
        else if (kind == 1) t = n + 1;
        else if (kind == 2) members[n] = members[0];
        else if (kind == 3) members[n] = address(0);
        if ((seed >> 192) % 2 == 1) _reverse(members); // the order of members doesn't matter
        bool valid = kind > 4;

        vm.prank(owner);
        try bond.proposeRefereeSet(members, t) returns (uint256 eta) {
            if (!valid) {
                ++ghostValidCallRejected; // accepted what it had to refuse
                return;
            }
            if (eta != block.timestamp + bond.refereeSetDelay()) ++ghostValidCallRejected;
            if (havePending) ++replacedProposals;
            (havePending, pendingPks, pendingThreshold, pendingProposedAt) = (true, pks, t, block.timestamp);
            ++proposals;
        } catch {
            if (valid) ++ghostValidCallRejected;
        }
    }

    /// The owner cancels the pending proposal (one call in four while there is one, so that most
    /// proposals live to be activated; always when there is none, which must revert).
    function cancelRefereeSet(uint256 seed) external {
        seed = uint256(keccak256(abi.encode(seed)));
        if (havePending && seed % 4 != 0) return;
        vm.prank(owner);
        try bond.cancelRefereeSet() {
            if (!havePending) ++ghostValidCallRejected;
            havePending = false;
            ++cancellations;
        } catch {
            if (havePending) ++ghostValidCallRejected;
        }
    }

    /// Anyone activates the pending proposal; allowed iff one is pending and refereeSetDelay has
    /// passed since it was proposed (by the handler's own clock). First, by `(callerSeed >> 64) % 8`:
    /// 1-4 warp to the pending eta (or one second before it) if it is at most resolveTimeout
    /// ahead, so challenges opened now are still open when the new epoch activates; 0 warps there
    /// from however far; 5-7 don't warp. So activations, and challenges decided by their epoch
    /// after a newer one activated, are common.
    function activateRefereeSet(uint256 callerSeed) external {
        callerSeed = uint256(keccak256(abi.encode(callerSeed)));
        uint256 jump = (callerSeed >> 64) % 8;
        if (havePending && jump < 5) {
            uint256 target = pendingProposedAt + bond.refereeSetDelay() - (callerSeed >> 67) % 2;
            bool near = target <= block.timestamp + bond.resolveTimeout();
            if (target > block.timestamp && (jump == 0 || near)) vm.warp(target);
        }
        bool allowed = havePending && block.timestamp >= pendingProposedAt + bond.refereeSetDelay();
        vm.prank(challengers[callerSeed % challengers.length]);
        try bond.activateRefereeSet() {
            if (!allowed) {
                ++ghostEarlyActivation;
                return;
            }
            uint256 e = ++ghostEpoch;
            (epochPks[e], epochThreshold[e]) = (pendingPks, pendingThreshold);
            (epochProposedAt[e], epochActivatedAt[e]) = (pendingProposedAt, block.timestamp);
            havePending = false;
            ++activations;
            _resolveStale(callerSeed >> 128);
        } catch {
            if (allowed) ++ghostValidCallRejected;
        }
    }

    function _reverse(address[] memory a) internal pure {
        for (uint256 i; i < a.length / 2; ++i) {
            (a[i], a[a.length - 1 - i]) = (a[a.length - 1 - i], a[i]);
        }
    }

    /// Scanning from a random index, the first challenge that is open and still resolvable
    /// (`resolvable`) or open and past its resolve timeout (`!resolvable`); if there is none, or
    /// for one call in eight, the random index's own, so closed challenges get calls too.
    function _pickChallenge(uint256 seed, bool resolvable) internal view returns (uint256) {
        uint256 n = challengeIds.length;
        uint256 start = seed % n;
        if ((seed >> 128) % 8 == 0) return challengeIds[start];
        for (uint256 i; i < n; ++i) {
            uint256 id = challengeIds[(start + i) % n];
            SpecmarketBond.Challenge memory c = bond.getChallenge(id);
            bool timely = block.timestamp <= uint256(c.createdAt) + bond.resolveTimeout();
            if (c.status == SpecmarketBond.ChallengeStatus.Open && timely == resolvable) return id;
        }
        return challengeIds[start];
    }

    // ---- key subsets -----------------------------------------------------------------------

    function _prefix(uint256[] memory sorted, uint256 n) internal pure returns (uint256[] memory out) {
        out = new uint256[](n);
        for (uint256 i; i < n; ++i) {
            out[i] = sorted[i];
        }
    }

    /// A subset of `sorted` with at least `m` members chosen by `seed`, still ascending.
    function _subset(uint256[] memory sorted, uint256 m, uint256 seed) internal pure returns (uint256[] memory out) {
        uint256 n = sorted.length;
        bool[] memory pick = new bool[](n);
        uint256 count;
        for (uint256 i; i < n; ++i) {
            if ((seed >> i) & 1 == 1) {
                pick[i] = true;
                ++count;
            }
        }
        for (uint256 i; i < n && count < m; ++i) {
            if (!pick[i]) {
                pick[i] = true;
                ++count;
            }
        }
        out = new uint256[](count);
        uint256 k;
        for (uint256 i; i < n; ++i) {
            if (pick[i]) out[k++] = sorted[i];
        }
    }
}
