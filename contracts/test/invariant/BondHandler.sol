// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {BondHelpers} from "../utils/BondFixture.sol";
import {TestUtils} from "../utils/TestBase.sol";
import {SpecmarketBond} from "../../src/SpecmarketBond.sol";

/// @dev Drives SpecmarketBond through random sequences of every user action, with real operator
///      and referee signatures and deliberately bad ones, and keeps ghost accounting to check it.
contract BondHandler is BondHelpers {
    SpecmarketBond public immutable bond;
    address public immutable owner;
    address public immutable treasury;

    uint256[] internal opPks;
    address[] public operators;
    address[] public challengers;
    uint256[] internal refPks; // all keys that were ever referees, sorted by address
    address[] internal refAddrs; // their addresses, same order
    uint256 internal constant OUTSIDER_PK = 0x0BAD;

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

    constructor(SpecmarketBond bond_, address owner_, uint256[] memory refPks_) {
        bond = bond_;
        owner = owner_;
        treasury = bond_.treasury();
        for (uint256 i; i < refPks_.length; ++i) {
            refPks.push(refPks_[i]);
            refAddrs.push(vm.addr(refPks_[i]));
        }
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
    /// (only timely ones can still block it); otherwise tries with whatever is still open.
    function withdrawBond(uint256 opSeed) external {
        address op = operators[opSeed % operators.length];
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
        } catch {
            if (expectOk) ++ghostValidCallRejected;
        }
    }

    /// mode 0: a valid quorum (a random subset of at least M current referees, ascending);
    /// 1: below threshold; 2: a repeated signer; 3: an outsider in the set; 4: descending order;
    /// 5: a quorum that signed the opposite verdict; 6: a quorum that signed another challenge.
    function resolve(uint256 idSeed, bool fault, uint256 mode, uint256 subsetSeed) external {
        if (challengeIds.length == 0) return;
        uint256 id = _pickChallenge(idSeed, true);
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        mode = mode % 12;
        if (mode > 6) mode = 0; // half of the attempts carry a valid quorum

        uint256[] memory current = _currentRefPks();
        uint256 m = bond.threshold();
        uint256[] memory pks;
        bool signedFault = fault;
        uint256 signedId = id;
        if (mode == 0) {
            pks = _subset(current, m, subsetSeed);
        } else if (mode == 1) {
            pks = _prefix(current, m - 1);
        } else if (mode == 2) {
            pks = _prefix(current, m);
            uint256[] memory d = new uint256[](m + 1);
            for (uint256 i; i < m; ++i) {
                d[i] = pks[i];
            }
            d[m] = pks[m - 1]; // repeated at the end: not strictly ascending
            pks = d;
        } else if (mode == 3) {
            pks = _prefix(current, m);
            pks[m - 1] = OUTSIDER_PK;
            pks = TestUtils.sortByAddress(pks);
        } else if (mode == 4) {
            pks = _prefix(current, m);
            if (m == 1) {
                pks = new uint256[](2);
                (pks[0], pks[1]) = (current[0], current[0]);
            } else {
                for (uint256 i; i < m / 2; ++i) {
                    (pks[i], pks[m - 1 - i]) = (pks[m - 1 - i], pks[i]);
                }
            }
        } else if (mode == 5) {
            pks = _subset(current, m, subsetSeed);
            signedFault = !fault;
        } else {
            pks = _subset(current, m, subsetSeed);
            signedId = id + 1 + subsetSeed % 3;
        }
        bytes[] memory sigs = _verdictSigs(bond, signedId, signedFault, pks);

        bool timely = block.timestamp <= uint256(c.createdAt) + bond.resolveTimeout();
        bool open = c.status == SpecmarketBond.ChallengeStatus.Open;
        try bond.resolve(id, fault, sigs) {
            if (mode != 0) {
                ++ghostBadResolveAccepted;
                return;
            }
            if (!open || !timely) ++ghostValidCallRejected; // accepted what it had to refuse
            if (!fault) ++clearedChallenges;
            if (fault && !ghostReceiptSlashed[c.receiptDigest]) {
                ghostReceiptSlashed[c.receiptDigest] = true;
                _ghostSlash(c.operator);
                ++slashesByQuorum;
                _resolvePileOn(id, c.receiptDigest, subsetSeed);
            } else if (fault) {
                ++repeatFaults; // the challenger gets its bond back; the bond is not slashed again
            }
        } catch {
            if (mode == 0 && open && timely) ++ghostValidCallRejected;
            if (mode != 0 && open && timely) ++badResolvesRejected;
        }
    }

    /// Right after a receipt is found at fault, a valid quorum finds another open challenge on the
    /// same receipt (a pile-on) at fault too: that challenger is refunded, the bond is not slashed
    /// again (the ghost bond doesn't move).
    function _resolvePileOn(uint256 id, bytes32 digest, uint256 subsetSeed) internal {
        for (uint256 i; i < challengeIds.length; ++i) {
            uint256 other = challengeIds[i];
            SpecmarketBond.Challenge memory c = bond.getChallenge(other);
            if (other == id || c.receiptDigest != digest || c.status != SpecmarketBond.ChallengeStatus.Open) continue;
            if (block.timestamp > uint256(c.createdAt) + bond.resolveTimeout()) continue;
            uint256[] memory pks = _subset(_currentRefPks(), bond.threshold(), subsetSeed);
            try bond.resolve(other, true, _verdictSigs(bond, other, true, pks)) {
                ++repeatFaults;
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

    /// The earliest deadline still ahead (0 if none): an operator's `unbondAt`, or an open
    /// challenge's last resolvable second (`+ 1` for odd `seed`: its first refundable second).
    function _nextDeadline(uint256 seed) internal view returns (uint256 next) {
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

    function setThreshold(uint256 m) external {
        m = bound(m, 1, bond.refereeCount());
        vm.prank(owner);
        bond.setThreshold(m);
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

    // ---- referee sets ----------------------------------------------------------------------

    function _currentRefPks() internal view returns (uint256[] memory out) {
        uint256 n;
        for (uint256 i; i < refPks.length; ++i) {
            if (bond.isReferee(refAddrs[i])) ++n;
        }
        out = new uint256[](n);
        uint256 k;
        for (uint256 i; i < refPks.length; ++i) {
            if (bond.isReferee(refAddrs[i])) out[k++] = refPks[i];
        }
    }

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
