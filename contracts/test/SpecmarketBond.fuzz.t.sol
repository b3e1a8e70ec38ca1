// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {BondFixture} from "./utils/BondFixture.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @dev Property tests over amounts, timings, positions, token arrays and signer sets.
contract SpecmarketBondFuzzTest is BondFixture {
    uint256[] internal fivePks; // five referee keys, sorted by address (computed once, not per run)
    address[] internal fiveAddrs;
    SpecmarketBond internal bond5; // a bond with those five referees and the operator registered

    function setUp() public override {
        super.setUp();
        (fivePks, fiveAddrs) = _refereeKeys(0x100, 5);
        bond5 = new SpecmarketBond(owner, _config(), fiveAddrs, 1);
        vm.prank(operator);
        bond5.register{value: 2 ether}(MODEL);
    }

    /// Largest token id the fuzzer picks; any uint32 is accepted by the contract.
    function _boundTokens(uint32[] memory t, uint256 maxLen) internal pure returns (uint32[] memory out) {
        uint256 n = t.length < maxLen ? t.length : maxLen;
        out = new uint32[](n);
        for (uint256 i; i < n; ++i) {
            out[i] = t[i];
        }
    }

    // -- hashing ----------------------------------------------------------------------------

    function testFuzz_hashOutput_isKeccakOf32ByteWords(uint32[] memory tokens) public view {
        tokens = _boundTokens(tokens, 256);
        assertEq(bond.hashOutput(tokens), _refHashTokens(tokens), "hashOutput");
    }

    function testFuzz_hashRequest_matchesReference(
        uint32[] memory p,
        uint64 seed,
        uint32 temperatureMicros,
        uint32 topK,
        uint32 topPMicros,
        uint32 maxTokens,
        bytes32 stopHash
    ) public view {
        p = _boundTokens(p, 256);
        SpecmarketBond.SamplingParams memory sp =
            SpecmarketBond.SamplingParams(seed, temperatureMicros, topK, topPMicros, maxTokens, stopHash);
        assertEq(bond.hashRequest(p, sp), _refHashRequest(p, sp), "hashRequest");
    }

    // -- signatures -------------------------------------------------------------------------

    function testFuzz_receiptSigner_recoversAnyKey(uint256 pk, bytes32 requestHash, uint64 issuedAt) public {
        pk = bound(pk, 1, SECP256K1_N - 1);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.operator = vm.addr(pk);
        r.requestHash = requestHash;
        r.issuedAt = issuedAt;
        bytes memory sig = _signReceipt(pk, r);
        assertEq(bond.receiptSigner(r, sig), vm.addr(pk), "recovers the signer");
        bytes memory bad = _highS(sig);
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        bond.receiptSigner(r, bad);
    }

    function testFuzz_challenge_receiptForAnyOtherChain_reverts(uint64 otherChain) public {
        vm.assume(otherChain != block.chainid);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        uint256 chain = block.chainid;
        vm.chainId(otherChain);
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.chainId(chain);
        address recovered = _recover(bond.receiptDigest(r), sig);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.InvalidReceiptSigner.selector, operator, recovered));
        _challenge(r, sig, 0);
    }

    // -- amounts ----------------------------------------------------------------------------

    function testFuzz_register_anyBondAtLeastMin_succeeds(uint256 amount, bytes32 model) public {
        amount = bound(amount, MIN_BOND, 1e30);
        address op = vm.addr(OTHER_PK);
        vm.deal(op, amount);
        vm.prank(op);
        bond.register{value: amount}(model);
        (bool registered, bool active, bytes32 m, uint256 b,,) = bond.operatorInfo(op);
        assertTrue(registered && active, "active");
        assertEq(m, model, "model");
        assertEq(b, amount, "bond");
    }

    function testFuzz_register_belowMin_reverts(uint256 amount) public {
        amount = bound(amount, 0, MIN_BOND - 1);
        address op = vm.addr(OTHER_PK);
        vm.deal(op, amount);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BondBelowMinimum.selector, amount, MIN_BOND));
        vm.prank(op);
        bond.register{value: amount}(MODEL);
    }

    function testFuzz_topUp_accumulates(uint96 a, uint96 b) public {
        vm.assume(a > 0 && b > 0);
        vm.deal(operator, uint256(a) + b);
        vm.prank(operator);
        bond.topUp{value: a}();
        vm.prank(operator);
        bond.topUp{value: b}();
        assertEq(_bondOf(operator), 2 ether + uint256(a) + b, "sum");
        assertEq(address(bond).balance, 2 ether + uint256(a) + b, "held");
    }

    function testFuzz_challenge_wrongBond_reverts(uint256 sent) public {
        sent = bound(sent, 0, 10 ether);
        vm.assume(sent != CHALLENGER_BOND);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.WrongChallengerBond.selector, sent, CHALLENGER_BOND));
        vm.prank(challenger);
        bond.challenge{value: sent}(r, sig, prompt, params, output, 0);
    }

    /// Slash split over fuzzed bond, slash amount and reward share, on a fresh deployment.
    function testFuzz_resolve_faultSplitsSlash(uint256 bondAmount, uint256 slashAmount, uint256 bps) public {
        bondAmount = bound(bondAmount, MIN_BOND, 1e27);
        slashAmount = bound(slashAmount, 1, 1e28);
        bps = bound(bps, 0, 9_999);
        SpecmarketBond.Config memory c = _config();
        c.slashAmount = slashAmount;
        c.challengerRewardBps = bps;
        bond = new SpecmarketBond(owner, c, refAddrs, 2);
        vm.deal(operator, bondAmount);
        vm.prank(operator);
        bond.register{value: bondAmount}(MODEL);

        uint256 id = _openChallenge();
        bond.resolve(id, true, _quorum(id, true, 2));

        uint256 slashed = slashAmount < bondAmount ? slashAmount : bondAmount;
        uint256 reward = slashed * bps / 10_000;
        assertEq(_bondOf(operator), bondAmount - slashed, "bond");
        assertEq(bond.credits(challenger), CHALLENGER_BOND + reward, "challenger");
        assertEq(bond.credits(treasury), slashed - reward, "treasury");
        assertEq(
            address(bond).balance, _bondOf(operator) + bond.credits(challenger) + bond.credits(treasury), "conservation"
        );
    }

    // -- timings ----------------------------------------------------------------------------

    function testFuzz_challenge_windowBoundaries(uint64 issuedBack, uint256 warpAhead) public {
        // receipt issued `issuedBack` seconds before now, challenge `warpAhead` seconds later
        issuedBack = uint64(bound(issuedBack, 0, 3 * CHALLENGE_WINDOW));
        warpAhead = bound(warpAhead, 0, 3 * CHALLENGE_WINDOW);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.issuedAt = uint64(block.timestamp) - issuedBack;
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.warp(block.timestamp + warpAhead);
        uint256 windowEnd = uint256(r.issuedAt) + CHALLENGE_WINDOW;
        if (block.timestamp > windowEnd) {
            vm.expectRevert(
                abi.encodeWithSelector(
                    SpecmarketBond.ChallengeWindowClosed.selector, r.issuedAt, windowEnd, block.timestamp
                )
            );
            _challenge(r, sig, 0);
        } else {
            uint256 id = _challenge(r, sig, 0);
            assertEq(_openOf(operator), 1, "opened");
            assertEq(bond.getChallenge(id).createdAt, block.timestamp, "createdAt");
        }
    }

    function testFuzz_challenge_futureReceipt_reverts(uint64 ahead) public {
        ahead = uint64(bound(ahead, 1, 365 days));
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.issuedAt = uint64(block.timestamp) + ahead;
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ReceiptFromFuture.selector, r.issuedAt, block.timestamp));
        _challenge(r, sig, 0);
    }

    function testFuzz_resolveOrRefund_partitionTime(uint256 wait, bool fault) public {
        wait = bound(wait, 0, 2 * RESOLVE_TIMEOUT);
        uint256 id = _openChallenge();
        uint256 deadline = block.timestamp + RESOLVE_TIMEOUT;
        bytes[] memory sigs = _quorum(id, fault, 2);
        vm.warp(block.timestamp + wait);
        if (block.timestamp <= deadline) {
            vm.expectRevert(
                abi.encodeWithSelector(SpecmarketBond.ResolveWindowNotClosed.selector, id, deadline, block.timestamp)
            );
            bond.refundExpired(id);
            bond.resolve(id, fault, sigs);
        } else {
            vm.expectRevert(
                abi.encodeWithSelector(SpecmarketBond.ResolveWindowClosed.selector, id, deadline, block.timestamp)
            );
            bond.resolve(id, fault, sigs);
            bond.refundExpired(id);
        }
        assertEq(_openOf(operator), 0, "closed exactly once");
    }

    function testFuzz_withdrawBond_timing(uint256 wait, bool withChallenge) public {
        wait = bound(wait, 0, 2 * UNBONDING_DELAY);
        uint256 id;
        if (withChallenge) id = _openChallenge();
        vm.prank(operator);
        bond.requestUnbond();
        uint256 unbondAt = block.timestamp + UNBONDING_DELAY;
        vm.warp(block.timestamp + wait);
        if (block.timestamp < unbondAt) {
            vm.expectRevert(
                abi.encodeWithSelector(
                    SpecmarketBond.UnbondingDelayNotElapsed.selector, operator, unbondAt, block.timestamp
                )
            );
        } else if (withChallenge) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.HasOpenChallenges.selector, operator, 1));
        }
        vm.prank(operator);
        bond.withdrawBond();
        if (block.timestamp >= unbondAt && withChallenge) {
            // the delay outlasts window + timeout, so the open challenge is always refundable by now
            bond.refundExpired(id);
            vm.prank(operator);
            bond.withdrawBond();
        }
    }

    /// Any receipt issued before requestUnbond is either out of its window, or its challenge is
    /// resolvable/refundable, by the time the bond can leave.
    function testFuzz_unbondingDelay_outlastsDisputes(uint256 issuedBack, uint256 challengeAfter) public {
        issuedBack = bound(issuedBack, 0, CHALLENGE_WINDOW);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.issuedAt = uint64(block.timestamp - issuedBack);
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.prank(operator);
        bond.requestUnbond();
        uint256 unbondAt = block.timestamp + UNBONDING_DELAY;
        challengeAfter = bound(challengeAfter, 0, CHALLENGE_WINDOW - issuedBack);
        vm.warp(block.timestamp + challengeAfter);
        uint256 id = _challenge(r, sig, 0);
        vm.warp(unbondAt);
        bytes[] memory sigs = _quorum(id, true, 2);
        // by the unbond time the resolve window is over: only a refund can close it
        vm.expectRevert(
            abi.encodeWithSelector(
                SpecmarketBond.ResolveWindowClosed.selector,
                id,
                bond.getChallenge(id).createdAt + RESOLVE_TIMEOUT,
                unbondAt
            )
        );
        bond.resolve(id, true, sigs);
        bond.refundExpired(id);
        vm.prank(operator);
        bond.withdrawBond();
    }

    // -- verdict binding --------------------------------------------------------------------

    /// A verdict signed for any other (id, receipt digest, position, challenger) than the
    /// challenge's own never resolves it.
    function testFuzz_resolve_mismatchedVerdictFields_reverts(
        uint256 id,
        bytes32 digest,
        uint32 position,
        address who,
        uint8 keep,
        bool fault
    ) public {
        uint256 real = _openChallenge();
        SpecmarketBond.Challenge memory c = bond.getChallenge(real);
        // keep some of the real fields (bit i of `keep`), so near misses get tried too
        if (keep & 1 != 0) id = real;
        if (keep & 2 != 0) digest = c.receiptDigest;
        if (keep & 4 != 0) position = c.position;
        if (keep & 8 != 0) who = c.challenger;
        vm.assume(id != real || digest != c.receiptDigest || position != c.position || who != c.challenger);
        uint256[] memory pks = new uint256[](2);
        (pks[0], pks[1]) = (refPks[0], refPks[1]);
        bytes[] memory sigs = _signDigest(bond.verdictDigest(id, digest, position, who, fault), pks);
        address first = _recover(bond.verdictDigest(real, c.receiptDigest, c.position, c.challenger, fault), sigs[0]);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotReferee.selector, first));
        bond.resolve(real, fault, sigs);
        assertEq(_bondOf(operator), 2 ether, "no slash");
    }

    /// verdictDigest equals the EIP-712 digest written out word by word, for any fields.
    function testFuzz_verdictDigest_matchesReference(
        uint256 id,
        bytes32 digest,
        uint32 position,
        address who,
        bool fault
    ) public view {
        assertEq(
            bond.verdictDigest(id, digest, position, who, fault),
            _refVerdictDigest(bond, id, digest, position, who, fault),
            "verdictDigest"
        );
    }

    // -- referee epochs ---------------------------------------------------------------------

    function testFuzz_constructor_refereeSetDelay(uint256 delay) public {
        delay = bound(delay, 0, 20 * 365 days);
        SpecmarketBond.Config memory c = _config();
        c.refereeSetDelay = delay;
        if (delay <= UNBONDING_DELAY) {
            vm.expectRevert(
                abi.encodeWithSelector(SpecmarketBond.RefereeSetDelayTooShort.selector, delay, UNBONDING_DELAY)
            );
        } else if (delay > 10 * 365 days) {
            vm.expectRevert(
                abi.encodeWithSelector(SpecmarketBond.RefereeSetDelayTooLong.selector, delay, 10 * 365 days)
            );
        }
        new SpecmarketBond(owner, c, refAddrs, 2);
    }

    /// Any member count, threshold, and a repeated or zero member: accepted iff valid.
    function testFuzz_proposeRefereeSet_validation(uint8 n, uint8 m, uint8 dupAt, bool zero) public {
        uint256 count = bound(n, 0, 40);
        address[] memory members = new address[](count);
        for (uint256 i; i < count; ++i) {
            members[i] = address(uint160(0xF000 + i));
        }
        bool dup = count >= 2 && dupAt % 4 == 0;
        uint256 idx = count == 0 ? 0 : dupAt % count;
        if (dup && idx != 0) members[idx] = members[0];
        if (zero && count > 0) members[idx] = address(0);
        dup = dup && idx != 0 && !zero;
        bool hasZero = zero && count > 0;
        if (count > 32) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.TooManyReferees.selector, count, 32));
        } else if (m == 0 || m > count) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.InvalidThreshold.selector, m, count));
        } else if (hasZero) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ZeroReferee.selector));
        } else if (dup) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.DuplicateReferee.selector, members[0]));
        }
        vm.prank(owner);
        bond.proposeRefereeSet(members, m);
        (address[] memory pending, uint256 pm,) = bond.pendingRefereeSet();
        bool valid = count <= 32 && m > 0 && m <= count && !hasZero && !dup;
        assertEq(pending.length, valid ? count : 0, "pending iff valid");
        assertEq(pm, valid ? m : 0, "pending threshold");
    }

    /// No set is activated before refereeSetDelay after its proposal; any time after, anyone can.
    function testFuzz_activateRefereeSet_timing(uint256 wait, address caller) public {
        wait = bound(wait, 0, 2 * REFEREE_SET_DELAY);
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(refAddrs, 1);
        vm.warp(block.timestamp + wait);
        if (block.timestamp < eta) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.RefereeSetNotReady.selector, eta, block.timestamp));
        }
        vm.prank(caller);
        bond.activateRefereeSet();
        assertEq(bond.refereeEpoch(), block.timestamp < eta ? 1 : 2, "epoch");
    }

    /// Epochs 1..k (disjoint 2-of-3 sets), a challenge opened under epoch `open`, maybe one more
    /// activation while it is open: only its own epoch's quorum decides it.
    function testFuzz_resolve_onlyOwnEpochQuorum(uint256 before, bool oneMore, uint256 signWith, bool fault) public {
        before = bound(before, 0, 3);
        for (uint256 i; i < before; ++i) {
            (, address[] memory addrs) = _refereeKeys(0x200 + 16 * (i + 2), 3);
            _activateSet(addrs, 2);
        }
        uint256 eta;
        if (oneMore) {
            (, address[] memory addrs) = _refereeKeys(0x200 + 16 * (before + 3), 3);
            vm.prank(owner);
            eta = bond.proposeRefereeSet(addrs, 2);
            vm.warp(eta - 1 days); // the challenge opens a day before the new set can be activated
        }
        uint256 id = _openChallenge();
        uint256 own = bond.getChallenge(id).refereeEpoch;
        assertEq(own, before + 1, "snapshotted epoch");
        if (oneMore) {
            vm.warp(eta);
            bond.activateRefereeSet();
        }
        uint256 s = 1 + bound(signWith, 0, bond.refereeEpoch() - 1);
        uint256[] memory pks;
        if (s == 1) pks = _prefix2(refPks);
        else (pks,) = _refereeKeys(0x200 + 16 * s, 3);
        bytes[] memory sigs = _verdictSigs(bond, id, fault, _prefix2(pks));
        if (s != own) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotReferee.selector, vm.addr(_prefix2(pks)[0])));
        }
        bond.resolve(id, fault, sigs);
        bool slashed = s == own && fault;
        assertEq(_bondOf(operator), slashed ? 2 ether - SLASH_AMOUNT : 2 ether, "only its own epoch decides");
    }

    function _prefix2(uint256[] memory pks) internal pure returns (uint256[] memory two) {
        two = new uint256[](2);
        (two[0], two[1]) = (pks[0], pks[1]);
    }

    /// However late within refereeSetDelay - unbondingDelay after a proposal the operator
    /// requests unbonding, its bond is out before the proposed set can be activated (or in the
    /// same second, ahead of it).
    function testFuzz_requestUnbond_afterProposal_escapes(uint256 reactAfter) public {
        reactAfter = bound(reactAfter, 0, REFEREE_SET_DELAY - UNBONDING_DELAY);
        address[] memory solo = new address[](1);
        solo[0] = vm.addr(0x5E1F);
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(solo, 1);
        vm.warp(block.timestamp + reactAfter);
        vm.prank(operator);
        bond.requestUnbond();
        vm.warp(block.timestamp + UNBONDING_DELAY);
        assertTrue(block.timestamp <= eta, "no later than the eta");
        vm.prank(operator);
        bond.withdrawBond();
        assertEq(bond.credits(operator), 2 ether, "whole bond credited");
    }

    // -- positions and token arrays ---------------------------------------------------------

    function testFuzz_challenge_positions(uint32[] memory out, uint32 position) public {
        output = _boundTokens(out, 128);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        if (position >= output.length) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.PositionOutOfRange.selector, position, output.length));
            _challenge(r, sig, position);
        } else {
            uint256 id = _challenge(r, sig, position);
            assertEq(bond.getChallenge(id).position, position, "position");
        }
    }

    function testFuzz_challenge_tamperedOutput_reverts(uint32[] memory out, uint256 idx, uint32 delta) public {
        output = _boundTokens(out, 64);
        vm.assume(output.length > 0 && delta != 0);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        idx = bound(idx, 0, output.length - 1);
        unchecked {
            output[idx] += delta;
        }
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.OutputHashMismatch.selector, _refHashTokens(output), r.outputHash)
        );
        _challenge(r, sig, 0);
    }

    function testFuzz_slashEquivocation_anyDistinctOutputs(uint32[] memory outA, uint32[] memory outB, bytes32 req)
        public
    {
        outA = _boundTokens(outA, 32);
        outB = _boundTokens(outB, 32);
        SpecmarketBond.Receipt memory a = _goodReceipt();
        SpecmarketBond.Receipt memory b = _goodReceipt();
        a.requestHash = req;
        b.requestHash = req;
        a.outputHash = _refHashTokens(outA);
        b.outputHash = _refHashTokens(outB);
        bytes memory sa = _signReceipt(OPERATOR_PK, a);
        bytes memory sb = _signReceipt(OPERATOR_PK, b);
        if (a.outputHash == b.outputHash) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.OutputHashesEqual.selector, a.outputHash));
            bond.slashEquivocation(a, sa, b, sb);
        } else {
            vm.prank(reporter);
            bond.slashEquivocation(a, sa, b, sb);
            assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "slashed");
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.EquivocationAlreadySlashed.selector, operator, req));
            bond.slashEquivocation(a, sa, b, sb);
        }
    }

    /// Two receipts with distinct outputs for one request are equivocation iff one store signed both.
    function testFuzz_slashEquivocation_storeNonces(uint64 nonceA, uint64 nonceB) public {
        SpecmarketBond.Receipt memory a = _goodReceipt();
        SpecmarketBond.Receipt memory b = _goodReceipt();
        b.outputHash = keccak256("another output");
        (a.storeNonce, b.storeNonce) = (nonceA, nonceB);
        bytes memory sa = _signReceipt(OPERATOR_PK, a);
        bytes memory sb = _signReceipt(OPERATOR_PK, b);
        uint256 before = _bondOf(operator);
        if (nonceA != nonceB) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.StoreNoncesDiffer.selector, nonceA, nonceB));
            bond.slashEquivocation(a, sa, b, sb);
            assertEq(_bondOf(operator), before, "not slashed");
        } else {
            vm.prank(reporter);
            bond.slashEquivocation(a, sa, b, sb);
            assertEq(_bondOf(operator), before - SLASH_AMOUNT, "slashed");
        }
    }

    // -- signer sets ------------------------------------------------------------------------

    /// N = 5 referees, any threshold M (set by a timelocked epoch change), any subset signs:
    /// resolves iff |subset| >= M.
    function testFuzz_resolve_signerSubsets(uint8 mask, uint256 m, bool fault) public {
        uint256[] memory all = fivePks;
        m = bound(m, 1, 5);
        bond = bond5;
        _activateSet(fiveAddrs, m); // epoch 2: the same five referees, threshold m
        uint256 id = _openChallenge();

        uint256 count;
        for (uint256 i; i < 5; ++i) {
            if (mask & (1 << i) != 0) ++count;
        }
        uint256[] memory pks = new uint256[](count);
        uint256 k;
        for (uint256 i; i < 5; ++i) {
            if (mask & (1 << i) != 0) pks[k++] = all[i];
        }
        bytes[] memory sigs = _verdictSigs(bond, id, fault, pks);
        if (count < m) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, count, m));
            bond.resolve(id, fault, sigs);
            assertEq(_bondOf(operator), 2 ether, "no slash below threshold");
        } else {
            bond.resolve(id, fault, sigs);
            assertEq(_bondOf(operator), fault ? 2 ether - SLASH_AMOUNT : 2 ether, "verdict applied");
        }
    }

    /// A signer set with one outsider or one repeated signer never resolves, whatever its size.
    function testFuzz_resolve_badSignerSet_reverts(uint256 outsiderPk, uint8 dupAt, bool fault) public {
        outsiderPk = bound(outsiderPk, 1, SECP256K1_N - 1);
        vm.assume(outsiderPk != refPks[0] && outsiderPk != refPks[1] && outsiderPk != refPks[2]);
        uint256 id = _openChallenge();

        // outsider + all three referees, in ascending address order
        address outsider = vm.addr(outsiderPk);
        uint256[] memory pks = new uint256[](4);
        uint256 k;
        for (uint256 i; i < 3; ++i) {
            if (k == i && outsider < refAddrs[i]) pks[k++] = outsiderPk;
            pks[k++] = refPks[i];
        }
        if (k == 3) pks[3] = outsiderPk;
        bytes[] memory sigs = _verdictSigs(bond, id, fault, pks);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotReferee.selector, outsider));
        bond.resolve(id, fault, sigs);

        // all three referees with one of them repeated next to itself
        uint256 d = bound(dupAt, 0, 2);
        bytes[] memory three = _quorum(id, fault, 3);
        bytes[] memory dup = new bytes[](4);
        uint256 j;
        for (uint256 i; i < 3; ++i) {
            dup[j++] = three[i];
            if (i == d) dup[j++] = three[i];
        }
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.SignersNotAscending.selector, refAddrs[d], refAddrs[d]));
        bond.resolve(id, fault, dup);
        assertEq(_bondOf(operator), 2 ether, "no slash");
    }
}
