// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {SpecmarketBond} from "../src/SpecmarketBond.sol";
import {BondFixture} from "./utils/BondFixture.sol";

/// @notice `challengeEnd`: an answer that stopped before `maxTokens` and not where its committed stop
///         rule ends it is challenged at its end (position = its length) and slashed like a wrong token.
contract SpecmarketBondEndTest is BondFixture {
    uint32 internal constant EOS = 151_643;

    uint256 internal constant REWARD = SLASH_AMOUNT * REWARD_BPS / 10_000;

    SpecmarketBond.StopRule internal stop;

    function setUp() public override {
        super.setUp();
        stop.tokens.push(EOS);
        stop.sequences.push("\n\n");
        params.stopHash = _refHashStop(stop);
    }

    /// @dev The reference formula (contracts/README.md, node/chain/receipts.py) written out apart.
    function _refHashStop(SpecmarketBond.StopRule memory s) internal pure returns (bytes32) {
        bytes32 tokensHash = _refHashTokens(s.tokens);
        if (s.sequences.length == 0) return tokensHash;
        bytes memory packed;
        for (uint256 i; i < s.sequences.length; ++i) {
            packed = bytes.concat(packed, keccak256(bytes(s.sequences[i])));
        }
        return keccak256(abi.encode(tokensHash, keccak256(packed)));
    }

    function _challengeEnd(SpecmarketBond.Receipt memory r, bytes memory sig) internal returns (uint256 id) {
        vm.prank(challenger);
        id = bond.challengeEnd{value: CHALLENGER_BOND}(r, sig, prompt, params, output, stop);
    }

    function test_challengeEnd_earlyStop_succeeds() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        bytes32 digest = bond.receiptDigest(r);
        uint32 end = uint32(output.length);
        vm.expectEmit(true, true, true, true, address(bond));
        emit SpecmarketBond.ChallengeOpened(1, operator, challenger, digest, MODEL, end, params, prompt, output);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.EndChallenged(1, stop);
        uint256 id = _challengeEnd(r, sig);
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        assertEq(c.position, end, "at the answer's end");
        assertEq(c.bond, CHALLENGER_BOND, "bond");
        assertEq(_openOf(operator), 1, "open");
    }

    function test_challengeEnd_resolvedAtFault_slashesLikeAWrongToken_succeeds() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        uint256 id = _challengeEnd(r, sig);
        bond.resolve(id, true, _quorum(id, true, 2));
        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "slashed");
        assertEq(bond.credits(challenger), CHALLENGER_BOND + REWARD, "bond back + reward");
        assertTrue(bond.getChallenge(id).status == SpecmarketBond.ChallengeStatus.OperatorAtFault, "status");
    }

    function test_challengeEnd_resolvedCleared_forfeitsTheBond_succeeds() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        uint256 id = _challengeEnd(r, sig);
        bond.resolve(id, false, _quorum(id, false, 2));
        assertEq(_bondOf(operator), 2 ether, "an honest end is never slashed");
        assertEq(bond.credits(challenger), 0, "the challenger's bond is forfeit");
    }

    function test_challengeEnd_otherStopRule_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        stop.sequences[0] = "\n"; // not the rule the request committed to
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.StopHashMismatch.selector, _refHashStop(stop), params.stopHash)
        );
        _challengeEnd(r, sig);
    }

    function test_challengeEnd_answerAtMaxTokens_reverts() public {
        params.maxTokens = uint32(output.length);
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.AnswerReachedMaxTokens.selector, output.length, params.maxTokens)
        );
        _challengeEnd(r, sig);
    }

    function test_challengeEnd_endedByStopToken_reverts() public {
        output[output.length - 1] = EOS;
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.EndedByStopToken.selector, EOS));
        _challengeEnd(r, sig);
    }

    function test_challengeEnd_tooManySequences_reverts() public {
        for (uint256 i; i < 4; ++i) {
            stop.sequences.push("x");
        }
        params.stopHash = _refHashStop(stop);
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.StopRuleTooLarge.selector, 1, 5, 2));
        _challengeEnd(r, sig);
    }

    function test_challengeEnd_wrongBond_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.WrongChallengerBond.selector, CHALLENGER_BOND - 1, CHALLENGER_BOND)
        );
        vm.prank(challenger);
        bond.challengeEnd{value: CHALLENGER_BOND - 1}(r, sig, prompt, params, output, stop);
    }

    function test_challenge_atTheEnd_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        uint32 end = uint32(output.length);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.PositionOutOfRange.selector, end, output.length));
        _challenge(r, sig, end); // a wrong-token challenge names a token; the end has its own
    }

    function test_hashStopRule_tokensAlone_isThePackedTokens_succeeds() public view {
        SpecmarketBond.StopRule memory tokensOnly;
        tokensOnly.tokens = stop.tokens;
        assertEq(bond.hashStopRule(tokensOnly), _refHashTokens(stop.tokens), "as before stop sequences");
        assertEq(bond.hashStopRule(stop), _refHashStop(stop), "with sequences");
    }

    function testFuzz_challengeEnd_opensBelowMaxTokensOnly(uint8 length, uint32 maxTokens, uint32 last) public {
        vm.assume(last != EOS && length > 0);
        maxTokens = uint32(bound(maxTokens, 1, 300));
        output = new uint32[](length);
        output[length - 1] = last;
        params.maxTokens = maxTokens;
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        if (length >= maxTokens) {
            vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.AnswerReachedMaxTokens.selector, length, maxTokens));
        }
        _challengeEnd(r, sig);
    }
}
