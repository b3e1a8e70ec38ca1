// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {BondHelpers} from "../utils/BondFixture.sol";
import {BondHandler} from "./BondHandler.sol";
import {SpecmarketBond} from "../../src/SpecmarketBond.sol";

/// @dev Handler-based invariants: forge calls random sequences of BondHandler's actions
///      (register, topUp, requestUnbond, withdrawBond, challenge, resolve with good and bad
///      signatures, refundExpired, slashEquivocation, withdraw, warp, and the referee-set
///      timelock: proposeRefereeSet, cancelRefereeSet, activateRefereeSet) and checks every
///      invariant after each call.
contract SpecmarketBondInvariantTest is BondHelpers {
    struct FuzzSelector {
        address addr;
        bytes4[] selectors;
    }

    SpecmarketBond internal bond;
    BondHandler internal handler;

    function setUp() public {
        vm.warp(1_700_000_000);
        // a pool of six referee keys; epoch 1 is the first four (by address), threshold 2
        (uint256[] memory pool, address[] memory poolAddrs) = _refereeKeys(0xA1, 6);
        address[] memory refs = new address[](4);
        for (uint256 i; i < 4; ++i) {
            refs[i] = poolAddrs[i];
        }
        // Short durations so that random warps cross every deadline within one run.
        SpecmarketBond.Config memory c = SpecmarketBond.Config({
            minBond: 1 ether,
            challengeWindow: 1 hours,
            unbondingDelay: 4 hours,
            challengerBond: 0.1 ether,
            resolveTimeout: 2 hours,
            slashAmount: 0.7 ether,
            challengerRewardBps: 3_000,
            treasury: address(0x7EA5),
            refereeSetDelay: 4 hours + 30 minutes
        });
        address owner = address(0x0A11CE);
        bond = new SpecmarketBond(owner, c, refs, 2);
        handler = new BondHandler(bond, owner, pool, 4, 2);
        // start with every operator bonded, so that challenges can start at call one
        for (uint256 i; i < handler.operatorCount(); ++i) {
            handler.register(i, 2 ether);
        }
    }

    /// forge's invariant runner reads these to decide what to call.
    function targetContracts() public view returns (address[] memory t) {
        t = new address[](1);
        t[0] = address(handler);
    }

    function targetSelectors() public view returns (FuzzSelector[] memory s) {
        bytes4[] memory sel = new bytes4[](19);
        sel[0] = BondHandler.register.selector;
        sel[1] = BondHandler.topUp.selector;
        sel[2] = BondHandler.requestUnbond.selector;
        // leaving is weighted up: a bond withdrawal attempt past unbondAt with a challenge still
        // open is the rarest sequence the invariants need
        sel[3] = BondHandler.withdrawBond.selector;
        sel[4] = BondHandler.withdrawBond.selector;
        // challenges and verdicts are weighted up: most paths need one, some need several
        sel[5] = BondHandler.challenge.selector;
        sel[6] = BondHandler.challenge.selector;
        sel[7] = BondHandler.resolve.selector;
        sel[8] = BondHandler.resolve.selector;
        sel[9] = BondHandler.resolve.selector;
        sel[10] = BondHandler.refundExpired.selector;
        sel[11] = BondHandler.slashEquivocation.selector;
        sel[12] = BondHandler.withdraw.selector;
        // time is weighted up too, so that runs get past unbonding delays and resolve timeouts
        sel[13] = BondHandler.warp.selector;
        sel[14] = BondHandler.warp.selector;
        // the referee-set timelock (activateRefereeSet also warps to the eta half of the time)
        sel[15] = BondHandler.proposeRefereeSet.selector;
        sel[16] = BondHandler.cancelRefereeSet.selector;
        sel[17] = BondHandler.activateRefereeSet.selector;
        sel[18] = BondHandler.challengeEnd.selector;
        s = new FuzzSelector[](1);
        s[0] = FuzzSelector(address(handler), sel);
    }

    /// The contract holds exactly what it owes: every operator bond, every open challenger bond
    /// and every unclaimed credit (and what came in minus what went out).
    function invariant_balanceEqualsLiabilities() public view {
        uint256 owed;
        uint256 nOps = handler.operatorCount();
        for (uint256 i; i < nOps; ++i) {
            (,,, uint256 b,,) = bond.operatorInfo(handler.operators(i));
            owed += b;
        }
        uint256 nCh = handler.challengeCount();
        for (uint256 i; i < nCh; ++i) {
            SpecmarketBond.Challenge memory c = bond.getChallenge(handler.challengeIds(i));
            if (c.status == SpecmarketBond.ChallengeStatus.Open) owed += c.bond;
        }
        address[] memory a = handler.actors();
        for (uint256 i; i < a.length; ++i) {
            owed += bond.credits(a[i]);
        }
        assertEq(address(bond).balance, owed, "balance == bonds + open challenger bonds + credits");
        assertEq(address(bond).balance, handler.ghostDeposited() - handler.ghostPaidOut(), "balance == in - out");
    }

    /// No bond moves except by a deposit, a valid referee quorum or a valid equivocation pair.
    function invariant_noSlashWithoutProof() public view {
        uint256 nOps = handler.operatorCount();
        for (uint256 i; i < nOps; ++i) {
            address op = handler.operators(i);
            (,,, uint256 b,,) = bond.operatorInfo(op);
            assertEq(b, handler.ghostBond(op), "bond == deposits - proven slashes");
        }
        assertEq(handler.ghostBadResolveAccepted(), 0, "resolve accepted a bad signature set");
        assertEq(handler.ghostBadEquivocationAccepted(), 0, "slashEquivocation accepted a bad pair");
    }

    /// No bond leaves before its unbonding delay or while a challenge against it is open.
    function invariant_noEarlyBondWithdrawal() public view {
        assertEq(handler.ghostEarlyBondWithdrawal(), 0, "bond withdrawn early");
    }

    /// Each operator's openChallenges counts exactly its Open challenges.
    function invariant_openChallengeCounts() public view {
        uint256 nOps = handler.operatorCount();
        uint256 nCh = handler.challengeCount();
        for (uint256 i; i < nOps; ++i) {
            address op = handler.operators(i);
            uint256 n;
            for (uint256 j; j < nCh; ++j) {
                SpecmarketBond.Challenge memory c = bond.getChallenge(handler.challengeIds(j));
                if (c.operator == op && c.status == SpecmarketBond.ChallengeStatus.Open) ++n;
            }
            (,,,,, uint256 open) = bond.operatorInfo(op);
            assertEq(open, n, "openChallenges");
        }
    }

    /// Valid calls are never refused (liveness) and every epoch's quorum is reachable.
    function invariant_validCallsSucceedAndQuorumReachable() public view {
        assertEq(handler.ghostValidCallRejected(), 0, "a valid call was refused or an invalid one accepted");
        uint256 m = bond.threshold();
        assertTrue(m > 0 && m <= bond.refereeCount(), "0 < threshold <= referees");
        uint256 current = bond.refereeEpoch();
        for (uint256 e = 1; e <= current; ++e) {
            m = bond.thresholdAt(e);
            assertTrue(m > 0 && m <= bond.refereesAt(e).length, "0 < thresholdAt(e) <= refereesAt(e)");
        }
    }

    /// No epoch activates earlier than refereeSetDelay after its proposal, and every epoch (and
    /// the pending proposal) is exactly the set the owner proposed.
    function invariant_refereeSetsTimelocked() public {
        assertEq(handler.ghostEarlyActivation(), 0, "a referee set activated before its delay");
        uint256 current = bond.refereeEpoch();
        assertEq(current, handler.ghostEpoch(), "epochs activated");
        for (uint256 e = 2; e <= current; ++e) {
            assertGe(
                handler.epochActivatedAt(e), handler.epochProposedAt(e) + bond.refereeSetDelay(), "activated early"
            );
        }
        uint256 pool = handler.poolSize();
        for (uint256 e = 1; e <= current; ++e) {
            _assertSameSet(bond.refereesAt(e), handler.epochMembers(e), e);
            assertEq(bond.thresholdAt(e), handler.epochThreshold(e), "thresholdAt");
            for (uint256 i; i < pool; ++i) {
                address a = handler.poolAddr(i);
                assertEq(bond.isRefereeAt(e, a), handler.ghostIsMember(e, a), "isRefereeAt == ghost membership");
            }
        }
        (address[] memory members, uint256 m, uint256 eta) = bond.pendingRefereeSet();
        if (handler.havePending()) {
            _assertSameSet(members, handler.pendingMembers(), current + 1);
            assertEq(m, handler.pendingThreshold(), "pending threshold");
            assertEq(eta, handler.pendingProposedAt() + bond.refereeSetDelay(), "eta");
        } else {
            assertEq(eta, 0, "no pending proposal");
            assertEq(members.length + m, 0, "empty pending set");
        }
        assertEq(bond.refereesAt(current + 1).length, 0, "a proposal is no epoch yet");
    }

    /// Every challenge snapshotted the epoch current when it opened, and every challenge closed
    /// with a verdict (at fault or cleared) had a valid quorum of that epoch.
    function invariant_verdictsHadOwnEpochQuorum() public view {
        assertEq(handler.ghostEpochMismatch(), 0, "a challenge snapshotted another epoch");
        uint256 nCh = handler.challengeCount();
        for (uint256 i; i < nCh; ++i) {
            uint256 id = handler.challengeIds(i);
            SpecmarketBond.Challenge memory c = bond.getChallenge(id);
            assertEq(c.refereeEpoch, handler.ghostChallengeEpoch(id), "snapshotted epoch");
            bool decided = c.status == SpecmarketBond.ChallengeStatus.OperatorAtFault
                || c.status == SpecmarketBond.ChallengeStatus.OperatorCleared;
            assertEq(handler.ghostVerdictEpoch(id), decided ? c.refereeEpoch : 0, "verdict by its own epoch's quorum");
        }
    }

    function _assertSameSet(address[] memory onChain, address[] memory ghost, uint256 e) internal view {
        assertEq(onChain.length, ghost.length, "set size");
        for (uint256 i; i < ghost.length; ++i) {
            assertTrue(bond.isRefereeAt(e, ghost[i]) || e > bond.refereeEpoch(), "member");
            bool found;
            for (uint256 j; j < onChain.length && !found; ++j) {
                found = onChain[j] == ghost[i];
            }
            assertTrue(found, "listed");
        }
    }

    /// The handler is not vacuous: one long seeded sequence of its actions reaches every path
    /// (quorum slashes, equivocation slashes, bond withdrawals, refunds, rejected bad signature
    /// sets) and keeps every invariant after every call.
    function test_handler_reachesEveryPath_succeeds() public {
        uint256 seed = 0x5EED;
        for (uint256 i; i < 600; ++i) {
            seed = uint256(keccak256(abi.encode(seed)));
            _dispatch(seed % 15, seed >> 8);
            if (i % 10 != 9) continue;
            invariant_balanceEqualsLiabilities();
            invariant_noSlashWithoutProof();
            invariant_noEarlyBondWithdrawal();
            invariant_openChallengeCounts();
            invariant_validCallsSucceedAndQuorumReachable();
            invariant_refereeSetsTimelocked();
            invariant_verdictsHadOwnEpochQuorum();
        }
        assertTrue(handler.slashesByQuorum() > 0, "a quorum slashed");
        assertTrue(handler.slashesByEquivocation() > 0, "an equivocation was slashed");
        assertTrue(handler.bondWithdrawals() > 0, "a bond was withdrawn");
        assertTrue(handler.refunds() > 0, "a challenge expired and was refunded");
        assertTrue(handler.badResolvesRejected() > 0, "bad signature sets were tried");
        assertTrue(handler.clearedChallenges() > 0, "a false challenge paid the operator");
        assertTrue(handler.repeatFaults() > 0, "a receipt was found at fault twice");
        assertTrue(handler.activations() > 0, "a proposed referee set was activated");
        assertTrue(handler.cancellations() > 0, "a proposal was cancelled");
        assertTrue(handler.replacedProposals() > 0, "a pending proposal was replaced");
        assertTrue(handler.staleEpochResolves() > 0, "a challenge was decided by its epoch after a newer one");
        assertTrue(handler.otherEpochQuorumsRejected() > 0, "another epoch's quorum was refused");
        assertTrue(handler.endChallenges() > 0, "an end challenge was opened");
    }

    function _dispatch(uint256 action, uint256 x) internal {
        uint256 y = uint256(keccak256(abi.encode(x)));
        if (action == 0) handler.register(x, y);
        else if (action == 1) handler.topUp(x, y);
        else if (action == 2) handler.requestUnbond(x);
        else if (action == 3) handler.withdrawBond(x);
        else if (action <= 5) handler.challenge(x, y, x >> 16, y >> 16, x >> 32);
        else if (action == 6) handler.resolve(x, y % 2 == 0, y >> 8, x >> 8);
        else if (action == 7) handler.refundExpired(x);
        else if (action == 8) handler.slashEquivocation(x, y, y >> 8, x >> 8);
        else if (action == 9) handler.withdraw(x);
        else if (action == 10) handler.warp(x);
        else if (action == 11) handler.proposeRefereeSet(y);
        else if (action == 12) handler.cancelRefereeSet(y);
        else if (action == 13) handler.challengeEnd(x, y, x >> 16, y >> 16);
        else handler.activateRefereeSet(x);
    }
}
