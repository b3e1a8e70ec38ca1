// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {BondFixture} from "./utils/BondFixture.sol";
import {TestUtils} from "./utils/TestBase.sol";
import {Anvil} from "../script/utils/DevChain.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {SafeCast} from "@openzeppelin/contracts/utils/math/SafeCast.sol";

/// @dev Refuses ETH, so `withdraw` to it fails.
contract EthRefuser {
    function callWithdraw(SpecmarketBond b) external {
        b.withdraw();
    }
}

/// @dev Re-enters `withdraw` from its receive hook and records how the inner call failed.
contract Reenterer {
    SpecmarketBond internal immutable b;
    bytes public innerError;
    uint256 public received;

    constructor(SpecmarketBond b_) {
        b = b_;
    }

    function start() external {
        b.withdraw();
    }

    receive() external payable {
        received += msg.value;
        try b.withdraw() {}
        catch (bytes memory err) {
            innerError = err;
        }
    }
}

/// @dev Unit tests: every external function's success path and every revert.
contract SpecmarketBondTest is BondFixture {
    uint256 internal constant REWARD = SLASH_AMOUNT * REWARD_BPS / 10_000;

    /*//////////////////////////////////////////////////////////////
                              CONSTRUCTOR
    //////////////////////////////////////////////////////////////*/

    function _expectDeployRevert(
        SpecmarketBond.Config memory c,
        address[] memory refs,
        uint256 threshold,
        bytes memory err
    ) internal {
        vm.expectRevert(err);
        new SpecmarketBond(owner, c, refs, threshold);
    }

    function test_constructor_setsConfig_succeeds() public view {
        assertEq(bond.minBond(), MIN_BOND, "minBond");
        assertEq(bond.challengeWindow(), CHALLENGE_WINDOW, "challengeWindow");
        assertEq(bond.unbondingDelay(), UNBONDING_DELAY, "unbondingDelay");
        assertEq(bond.challengerBond(), CHALLENGER_BOND, "challengerBond");
        assertEq(bond.resolveTimeout(), RESOLVE_TIMEOUT, "resolveTimeout");
        assertEq(bond.slashAmount(), SLASH_AMOUNT, "slashAmount");
        assertEq(bond.challengerRewardBps(), REWARD_BPS, "rewardBps");
        assertEq(bond.treasury(), treasury, "treasury");
        assertEq(bond.refereeSetDelay(), REFEREE_SET_DELAY, "refereeSetDelay");
        assertEq(bond.owner(), owner, "owner");
        assertEq(bond.refereeEpoch(), 1, "epoch 1");
        assertEq(bond.threshold(), 2, "threshold");
        assertEq(bond.thresholdAt(1), 2, "thresholdAt(1)");
        assertEq(bond.refereeCount(), 3, "refereeCount");
        address[] memory listed = bond.referees();
        address[] memory listedAt = bond.refereesAt(1);
        assertEq(listed.length, 3, "referees()");
        assertEq(listedAt.length, 3, "refereesAt(1)");
        for (uint256 i; i < 3; ++i) {
            assertTrue(bond.isReferee(refAddrs[i]), "isReferee");
            assertTrue(bond.isRefereeAt(1, refAddrs[i]), "isRefereeAt");
            assertEq(listed[i], refAddrs[i], "referees() in the constructor's order");
            assertEq(listedAt[i], refAddrs[i], "refereesAt(1) in the constructor's order");
        }
        assertFalse(bond.isReferee(owner), "the owner is no referee");
        (address[] memory pending, uint256 m, uint256 eta) = bond.pendingRefereeSet();
        assertEq(pending.length + m + eta, 0, "nothing pending");
        assertEq(bond.nextChallengeId(), 1, "ids start at 1");
    }

    function test_constructor_emitsRefereeSetActivated_succeeds() public {
        vm.expectEmit(true, false, false, true);
        emit SpecmarketBond.RefereeSetActivated(1, refAddrs, 3);
        new SpecmarketBond(owner, _config(), refAddrs, 3);
    }

    function test_constructor_zeroMinBond_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.minBond = 0;
        _expectDeployRevert(c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.ZeroMinBond.selector));
    }

    function test_constructor_zeroChallengeWindow_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.challengeWindow = 0;
        _expectDeployRevert(c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.ZeroChallengeWindow.selector));
    }

    function test_constructor_zeroResolveTimeout_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.resolveTimeout = 0;
        _expectDeployRevert(c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.ZeroResolveTimeout.selector));
    }

    function test_constructor_unbondingDelayEqualToWindowPlusTimeout_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.unbondingDelay = CHALLENGE_WINDOW + RESOLVE_TIMEOUT;
        _expectDeployRevert(
            c,
            refAddrs,
            2,
            abi.encodeWithSelector(
                SpecmarketBond.UnbondingDelayTooShort.selector, c.unbondingDelay, CHALLENGE_WINDOW, RESOLVE_TIMEOUT
            )
        );
    }

    function test_constructor_unbondingDelayTooLong_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.unbondingDelay = 5 * 365 days + 1;
        _expectDeployRevert(
            c,
            refAddrs,
            2,
            abi.encodeWithSelector(SpecmarketBond.UnbondingDelayTooLong.selector, c.unbondingDelay, 5 * 365 days)
        );
    }

    function test_constructor_maxUnbondingDelay_succeeds() public {
        SpecmarketBond.Config memory c = _config();
        c.unbondingDelay = 5 * 365 days;
        c.refereeSetDelay = 5 * 365 days + 1;
        SpecmarketBond b = new SpecmarketBond(owner, c, refAddrs, 2);
        vm.deal(operator, 1 ether);
        vm.prank(operator);
        b.register{value: 1 ether}(MODEL);
        vm.warp(type(uint32).max); // year 2106: unbondAt still fits
        vm.prank(operator);
        b.requestUnbond();
        vm.warp(block.timestamp + 5 * 365 days);
        vm.prank(operator);
        b.withdrawBond();
        assertEq(b.credits(operator), 1 ether, "bond can always leave");
    }

    function test_constructor_unbondingDelayJustAboveWindowPlusTimeout_succeeds() public {
        SpecmarketBond.Config memory c = _config();
        c.unbondingDelay = CHALLENGE_WINDOW + RESOLVE_TIMEOUT + 1;
        SpecmarketBond b = new SpecmarketBond(owner, c, refAddrs, 2);
        assertEq(b.unbondingDelay(), c.unbondingDelay, "unbondingDelay");
    }

    function test_constructor_refereeSetDelayEqualToUnbondingDelay_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.refereeSetDelay = UNBONDING_DELAY;
        _expectDeployRevert(
            c,
            refAddrs,
            2,
            abi.encodeWithSelector(SpecmarketBond.RefereeSetDelayTooShort.selector, UNBONDING_DELAY, UNBONDING_DELAY)
        );
    }

    function test_constructor_zeroRefereeSetDelay_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.refereeSetDelay = 0;
        _expectDeployRevert(
            c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.RefereeSetDelayTooShort.selector, 0, UNBONDING_DELAY)
        );
    }

    function test_constructor_refereeSetDelayJustAboveUnbondingDelay_succeeds() public {
        SpecmarketBond.Config memory c = _config();
        c.refereeSetDelay = UNBONDING_DELAY + 1;
        SpecmarketBond b = new SpecmarketBond(owner, c, refAddrs, 2);
        assertEq(b.refereeSetDelay(), UNBONDING_DELAY + 1, "refereeSetDelay");
    }

    function test_constructor_refereeSetDelayTooLong_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.refereeSetDelay = 10 * 365 days + 1;
        _expectDeployRevert(
            c,
            refAddrs,
            2,
            abi.encodeWithSelector(SpecmarketBond.RefereeSetDelayTooLong.selector, c.refereeSetDelay, 10 * 365 days)
        );
    }

    function test_constructor_maxRefereeSetDelay_succeeds() public {
        SpecmarketBond.Config memory c = _config();
        c.refereeSetDelay = 10 * 365 days;
        SpecmarketBond b = new SpecmarketBond(owner, c, refAddrs, 2);
        vm.warp(type(uint32).max); // year 2106: the eta still fits
        vm.prank(owner);
        uint256 eta = b.proposeRefereeSet(refAddrs, 1);
        assertEq(eta, uint256(type(uint32).max) + 10 * 365 days, "eta");
        vm.warp(eta);
        b.activateRefereeSet();
        assertEq(b.threshold(), 1, "every proposal can take effect");
    }

    function test_constructor_zeroChallengerBond_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.challengerBond = 0;
        _expectDeployRevert(c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.InvalidChallengerBond.selector, 0));
    }

    function test_constructor_challengerBondAboveUint96_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.challengerBond = uint256(type(uint96).max) + 1;
        _expectDeployRevert(
            c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.InvalidChallengerBond.selector, c.challengerBond)
        );
    }

    function test_constructor_zeroSlashAmount_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.slashAmount = 0;
        _expectDeployRevert(c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.ZeroSlashAmount.selector));
    }

    function test_constructor_rewardBpsFull_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.challengerRewardBps = 10_000;
        _expectDeployRevert(c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.RewardBpsTooHigh.selector, 10_000));
    }

    function test_constructor_zeroTreasury_reverts() public {
        SpecmarketBond.Config memory c = _config();
        c.treasury = address(0);
        _expectDeployRevert(c, refAddrs, 2, abi.encodeWithSelector(SpecmarketBond.ZeroTreasury.selector));
    }

    function test_constructor_zeroOwner_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableInvalidOwner.selector, address(0)));
        new SpecmarketBond(address(0), _config(), refAddrs, 2);
    }

    function test_constructor_zeroReferee_reverts() public {
        address[] memory refs = new address[](2);
        refs[0] = refAddrs[0];
        _expectDeployRevert(_config(), refs, 1, abi.encodeWithSelector(SpecmarketBond.ZeroReferee.selector));
    }

    function test_constructor_duplicateReferee_reverts() public {
        address[] memory refs = new address[](2);
        refs[0] = refAddrs[0];
        refs[1] = refAddrs[0];
        _expectDeployRevert(
            _config(), refs, 1, abi.encodeWithSelector(SpecmarketBond.DuplicateReferee.selector, refAddrs[0])
        );
    }

    function test_constructor_tooManyReferees_reverts() public {
        _expectDeployRevert(
            _config(), _addrs(33), 1, abi.encodeWithSelector(SpecmarketBond.TooManyReferees.selector, 33, 32)
        );
    }

    /// 32 referees, all 32 must sign: the largest quorum check, with bounded gas.
    function test_constructor_maxReferees_succeeds() public {
        (uint256[] memory pks, address[] memory addrs) = _refereeKeys(0x1000, 32);
        bond = new SpecmarketBond(owner, _config(), addrs, 32);
        vm.prank(operator);
        bond.register{value: 2 ether}(MODEL);
        uint256 id = _openChallenge();
        bond.resolve(id, true, _verdictSigs(bond, id, true, pks));
        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "a 32-of-32 quorum resolves");
    }

    function test_constructor_zeroThreshold_reverts() public {
        _expectDeployRevert(
            _config(), refAddrs, 0, abi.encodeWithSelector(SpecmarketBond.InvalidThreshold.selector, 0, 3)
        );
    }

    function test_constructor_thresholdAboveRefereeCount_reverts() public {
        _expectDeployRevert(
            _config(), refAddrs, 4, abi.encodeWithSelector(SpecmarketBond.InvalidThreshold.selector, 4, 3)
        );
    }

    function test_constructor_noReferees_reverts() public {
        _expectDeployRevert(
            _config(), new address[](0), 1, abi.encodeWithSelector(SpecmarketBond.InvalidThreshold.selector, 1, 0)
        );
    }

    /*//////////////////////////////////////////////////////////////
                               OPERATORS
    //////////////////////////////////////////////////////////////*/

    function test_register_minBond_succeeds() public {
        address op = vm.addr(OTHER_PK);
        vm.deal(op, MIN_BOND);
        bytes32 model = keccak256("other");
        vm.expectEmit(true, true, false, true, address(bond));
        emit SpecmarketBond.OperatorRegistered(op, model, MIN_BOND);
        vm.prank(op);
        bond.register{value: MIN_BOND}(model);

        (bool registered, bool active, bytes32 m, uint256 b, uint256 unbondAt, uint256 open) = bond.operatorInfo(op);
        assertTrue(registered, "registered");
        assertTrue(active, "active");
        assertEq(m, model, "modelHash");
        assertEq(b, MIN_BOND, "bond");
        assertEq(unbondAt, 0, "unbondAt");
        assertEq(open, 0, "openChallenges");
        assertEq(address(bond).balance, 2 ether + MIN_BOND, "balance");
    }

    function test_register_belowMinBond_reverts() public {
        address op = vm.addr(OTHER_PK);
        vm.deal(op, MIN_BOND);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BondBelowMinimum.selector, MIN_BOND - 1, MIN_BOND));
        vm.prank(op);
        bond.register{value: MIN_BOND - 1}(MODEL);
    }

    function test_register_alreadyRegistered_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.AlreadyRegistered.selector, operator));
        vm.prank(operator);
        bond.register{value: MIN_BOND}(MODEL);
    }

    function test_register_whileUnbonding_reverts() public {
        vm.prank(operator);
        bond.requestUnbond();
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.AlreadyRegistered.selector, operator));
        vm.prank(operator);
        bond.register{value: MIN_BOND}(MODEL);
    }

    function test_register_againAfterWithdrawBond_succeeds() public {
        _leave(operator);
        bytes32 newModel = keccak256("new model");
        vm.prank(operator);
        bond.register{value: MIN_BOND}(newModel);
        (bool registered, bool active, bytes32 m, uint256 b, uint256 unbondAt,) = bond.operatorInfo(operator);
        assertTrue(registered && active, "registered again");
        assertEq(m, newModel, "new model");
        assertEq(b, MIN_BOND, "new bond only");
        assertEq(unbondAt, 0, "unbond cleared");
        assertEq(bond.credits(operator), 2 ether, "old bond credited");
    }

    function test_register_bondAboveUint128_reverts() public {
        address op = vm.addr(OTHER_PK);
        uint256 amount = uint256(type(uint128).max) + 1;
        vm.deal(op, amount);
        vm.expectRevert(abi.encodeWithSelector(SafeCast.SafeCastOverflowedUintDowncast.selector, 128, amount));
        vm.prank(op);
        bond.register{value: amount}(MODEL);
    }

    function test_topUp_addsToBond_succeeds() public {
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.BondToppedUp(operator, 1 ether, 3 ether);
        vm.prank(operator);
        bond.topUp{value: 1 ether}();
        assertEq(_bondOf(operator), 3 ether, "bond");
    }

    function test_topUp_whileUnbonding_succeeds() public {
        vm.prank(operator);
        bond.requestUnbond();
        vm.prank(operator);
        bond.topUp{value: 1 ether}();
        assertEq(_bondOf(operator), 3 ether, "bond");
    }

    function test_topUp_notRegistered_reverts() public {
        vm.deal(reporter, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotRegistered.selector, reporter));
        vm.prank(reporter);
        bond.topUp{value: 1 ether}();
    }

    function test_topUp_zeroValue_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ZeroValue.selector));
        vm.prank(operator);
        bond.topUp();
    }

    function test_topUp_bondAboveUint128_reverts() public {
        uint256 amount = uint256(type(uint128).max) - 2 ether + 1; // the bond is 2 ether
        vm.deal(operator, amount);
        vm.expectRevert(
            abi.encodeWithSelector(
                SafeCast.SafeCastOverflowedUintDowncast.selector, 128, uint256(type(uint128).max) + 1
            )
        );
        vm.prank(operator);
        bond.topUp{value: amount}();
    }

    function test_requestUnbond_startsDelay_succeeds() public {
        uint256 unbondAt = block.timestamp + UNBONDING_DELAY;
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.UnbondRequested(operator, unbondAt);
        vm.prank(operator);
        bond.requestUnbond();
        (bool registered, bool active,,, uint256 unbondAt_,) = bond.operatorInfo(operator);
        assertTrue(registered, "still registered");
        assertFalse(active, "no longer active");
        assertEq(unbondAt_, unbondAt, "unbondAt");
    }

    function test_requestUnbond_notRegistered_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotRegistered.selector, reporter));
        vm.prank(reporter);
        bond.requestUnbond();
    }

    function test_requestUnbond_twice_reverts() public {
        vm.prank(operator);
        bond.requestUnbond();
        uint256 unbondAt = block.timestamp + UNBONDING_DELAY;
        vm.warp(block.timestamp + 1);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.AlreadyUnbonding.selector, operator, unbondAt));
        vm.prank(operator);
        bond.requestUnbond();
    }

    function test_requestUnbond_unbondAtAboveUint48_reverts() public {
        uint256 unbondAt = uint256(type(uint48).max) + 1;
        vm.warp(unbondAt - UNBONDING_DELAY); // ~8.9 million years from now
        vm.expectRevert(abi.encodeWithSelector(SafeCast.SafeCastOverflowedUintDowncast.selector, 48, unbondAt));
        vm.prank(operator);
        bond.requestUnbond();
    }

    function test_withdrawBond_afterDelay_succeeds() public {
        vm.prank(operator);
        bond.requestUnbond();
        vm.warp(block.timestamp + UNBONDING_DELAY);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.BondWithdrawn(operator, 2 ether);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(operator, 2 ether);
        vm.prank(operator);
        bond.withdrawBond();
        (bool registered,, bytes32 m, uint256 b, uint256 unbondAt_,) = bond.operatorInfo(operator);
        assertFalse(registered, "record deleted");
        assertEq(m, bytes32(0), "model cleared");
        assertEq(b, 0, "bond moved");
        assertEq(unbondAt_, 0, "unbondAt cleared");
        assertEq(bond.credits(operator), 2 ether, "credited");
        assertEq(address(bond).balance, 2 ether, "still held until withdraw()");
    }

    function test_withdrawBond_notRegistered_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotRegistered.selector, reporter));
        vm.prank(reporter);
        bond.withdrawBond();
    }

    function test_withdrawBond_unbondNotRequested_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.UnbondNotRequested.selector, operator));
        vm.prank(operator);
        bond.withdrawBond();
    }

    function test_withdrawBond_beforeDelay_reverts() public {
        vm.prank(operator);
        bond.requestUnbond();
        uint256 unbondAt = block.timestamp + UNBONDING_DELAY;
        vm.warp(unbondAt - 1);
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.UnbondingDelayNotElapsed.selector, operator, unbondAt, unbondAt - 1)
        );
        vm.prank(operator);
        bond.withdrawBond();
    }

    function test_withdrawBond_duringOpenChallenge_reverts() public {
        _openChallenge();
        vm.prank(operator);
        bond.requestUnbond();
        vm.warp(block.timestamp + UNBONDING_DELAY);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.HasOpenChallenges.selector, operator, 1));
        vm.prank(operator);
        bond.withdrawBond();
    }

    function test_withdrawBond_afterExpiredChallengeRefunded_succeeds() public {
        uint256 id = _openChallenge();
        vm.prank(operator);
        bond.requestUnbond();
        vm.warp(block.timestamp + UNBONDING_DELAY);
        bond.refundExpired(id);
        vm.prank(operator);
        bond.withdrawBond();
        assertEq(bond.credits(operator), 2 ether, "bond credited");
    }

    function test_operatorInfo_unknown_succeeds() public view {
        (bool registered, bool active, bytes32 m, uint256 b, uint256 unbondAt_, uint256 open) =
            bond.operatorInfo(reporter);
        assertFalse(registered || active, "unknown");
        assertEq(m, bytes32(0), "model");
        assertEq(b + unbondAt_ + open, 0, "zeros");
    }

    function test_operatorInfo_inactiveBelowMinBondAfterSlash_succeeds() public {
        // 2 ETH bond, 0.5 ETH slash: 2 slashes leave 1 ETH (active), 3 leave 0.5 ETH (inactive).
        for (uint256 i; i < 3; ++i) {
            _equivocate(bytes32(i));
        }
        (bool registered, bool active,, uint256 b,,) = bond.operatorInfo(operator);
        assertTrue(registered, "registered");
        assertFalse(active, "below minBond is inactive");
        assertEq(b, 0.5 ether, "bond");
    }

    /// @dev A well-formed 65-byte signature (r = s = 0, v = 27) that recovers no address.
    function _zeroSig() internal pure returns (bytes memory) {
        return abi.encodePacked(bytes32(0), bytes32(0), uint8(27));
    }

    /*//////////////////////////////////////////////////////////////
                               HASHING
    //////////////////////////////////////////////////////////////*/

    // Known-answer vectors, computed independently in Python (pycryptodome keccak + coincurve):
    // prompt [1,2,3], seed 42, temperature 0.7, topK 50, topP 0.9, maxTokens 16, stop tokens
    // [151643, 151645] (Qwen's two end-of-sequence tokens), output [7,8,9,65535].
    bytes32 internal constant KAT_PROMPT_HASH = 0x6e0c627900b24bd432fe7b1f713f1b0744091a646a9fe4a65a18dfed21f2949c;
    bytes32 internal constant KAT_REQUEST_HASH = 0x30afb32e14006183d0e95585b88a1158f4e4f7e57ded4c63fc2f51fb6c3d8899;
    bytes32 internal constant KAT_STOP_HASH = 0x7606a76b7376204e38684872b7873a727848232b461e38dad7dc6321433b2d15;
    bytes32 internal constant KAT_OUTPUT_HASH = 0x727f0a8034e1bcbf709bc02d80f5258b22a936751793243b003e4b0984ed8afb;
    // bond at 0x5FbDB2315678afecb367f032d93F642f64180aa3 on chain 31337; operator key 0xB0B; issuedAt 1.7e9;
    // storeNonce 0x5707E.
    bytes32 internal constant KAT_DOMAIN = 0x408a43d5eb2998feca380fd4851cd16b61794853ce88550d3439ebdbffa58a20;
    bytes32 internal constant KAT_RECEIPT_DIGEST = 0x9769a0519b798e4fa829dbfce1baea5c575454a3be54ef096f9d6b11aa06ca7d;
    // Verdict: challengeId 7, the receipt digest above, position 3, challenger 0x…C4A1, at fault.
    bytes32 internal constant KAT_VERDICT_DIGEST = 0x84cb693a84d367b1e77f4bd8d56fa30427ac127fbcb6622e455d9ad4da92ab95;
    bytes internal constant KAT_SIG =
        hex"e7282eb4c0c202dcc5d5a4edf90202bce1cbcc2ec54b29f253bb332e399e02c61dd65c6e864e57b2babc34ef790f267258e2ed179cc6e0d28597a9ea903d62241b";

    function _katBond() internal returns (SpecmarketBond b) {
        // anvil's account 0 deploying with nonce 0 lands at 0x5FbDB231...
        vm.prank(0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266);
        b = new SpecmarketBond(owner, _config(), refAddrs, 2);
        assertEq(address(b), 0x5FbDB2315678afecb367f032d93F642f64180aa3, "deterministic address");
    }

    function _katPrompt() internal pure returns (uint32[] memory p) {
        p = new uint32[](3);
        (p[0], p[1], p[2]) = (1, 2, 3);
    }

    function _katStops() internal pure returns (uint32[] memory s) {
        s = new uint32[](2);
        (s[0], s[1]) = (151_643, 151_645);
    }

    function _katOutput() internal pure returns (uint32[] memory o) {
        o = new uint32[](4);
        (o[0], o[1], o[2], o[3]) = (7, 8, 9, 65535);
    }

    function test_hashRequest_knownAnswer_succeeds() public view {
        assertEq(bond.hashOutput(_katPrompt()), KAT_PROMPT_HASH, "promptHash");
        assertEq(bond.hashOutput(_katStops()), KAT_STOP_HASH, "stopHash");
        SpecmarketBond.SamplingParams memory p =
            SpecmarketBond.SamplingParams(42, 700_000, 50, 900_000, 16, KAT_STOP_HASH);
        assertEq(bond.hashRequest(_katPrompt(), p), KAT_REQUEST_HASH, "requestHash");
        assertEq(
            bond.REQUEST_TYPEHASH(),
            keccak256(
                "Request(bytes32 promptHash,uint64 seed,uint32 temperatureMicros,uint32 topK,uint32 topPMicros,uint32 maxTokens,bytes32 stopHash)"
            ),
            "typehash"
        );
    }

    function test_hashOutput_knownAnswer_succeeds() public view {
        assertEq(bond.hashOutput(_katOutput()), KAT_OUTPUT_HASH, "outputHash");
        assertEq(bond.hashOutput(new uint32[](0)), keccak256(""), "empty output hashes to keccak256(\"\")");
    }

    function test_receiptDigest_knownAnswer_succeeds() public {
        vm.chainId(31337);
        SpecmarketBond b = _katBond();
        assertEq(b.domainSeparator(), KAT_DOMAIN, "domain separator");
        SpecmarketBond.Receipt memory r = SpecmarketBond.Receipt({
            operator: operator,
            modelHash: MODEL,
            requestHash: KAT_REQUEST_HASH,
            outputHash: KAT_OUTPUT_HASH,
            tokenCount: 4,
            issuedAt: 1_700_000_000,
            storeNonce: STORE_NONCE
        });
        assertEq(b.receiptDigest(r), KAT_RECEIPT_DIGEST, "receipt digest");
        // forge's vm.sign and libsecp256k1 both use RFC 6979 nonces: same signature byte for byte.
        assertEq(keccak256(TestUtils.sign(OPERATOR_PK, b.receiptDigest(r))), keccak256(KAT_SIG), "signature");
        assertEq(b.receiptSigner(r, KAT_SIG), operator, "signer");
        assertEq(b.verdictDigest(7, KAT_RECEIPT_DIGEST, 3, challenger, true), KAT_VERDICT_DIGEST, "verdict digest");
    }

    function test_receiptDigest_matchesManualEip712_succeeds() public view {
        bytes32 domain = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("SpecmarketBond"),
                keccak256("1"),
                block.chainid,
                address(bond)
            )
        );
        assertEq(bond.domainSeparator(), domain, "domain");
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes32 structHash = keccak256(
            abi.encode(
                keccak256(
                    "Receipt(address operator,bytes32 modelHash,bytes32 requestHash,bytes32 outputHash,uint32 tokenCount,uint64 issuedAt,uint64 storeNonce)"
                ),
                r.operator,
                r.modelHash,
                r.requestHash,
                r.outputHash,
                r.tokenCount,
                r.issuedAt,
                r.storeNonce
            )
        );
        assertEq(bond.receiptDigest(r), keccak256(abi.encodePacked("\x19\x01", domain, structHash)), "digest");
        bytes32 verdictStruct = keccak256(
            abi.encode(
                keccak256(
                    "Verdict(uint256 challengeId,bytes32 receiptDigest,uint32 position,address challenger,bool operatorAtFault)"
                ),
                uint256(9),
                bond.receiptDigest(r),
                uint32(5),
                challenger,
                false
            )
        );
        assertEq(
            bond.verdictDigest(9, bond.receiptDigest(r), 5, challenger, false),
            keccak256(abi.encodePacked("\x19\x01", domain, verdictStruct)),
            "verdict"
        );
        assertEq(
            bond.verdictDigest(9, bond.receiptDigest(r), 5, challenger, false),
            _refVerdictDigest(bond, 9, bond.receiptDigest(r), 5, challenger, false),
            "verdict, word by word"
        );
    }

    function test_receiptSigner_recoversOperator_succeeds() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        assertEq(bond.receiptSigner(r, _signReceipt(OPERATOR_PK, r)), operator, "signer");
        assertEq(bond.receiptSigner(r, _signReceipt(OTHER_PK, r)), vm.addr(OTHER_PK), "any signer");
    }

    function test_receiptSigner_highS_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes memory bad = _highS(_signReceipt(OPERATOR_PK, r));
        // ecrecover itself accepts the malleable twin; the contract must not.
        assertEq(_recover(bond.receiptDigest(r), bad), operator, "ecrecover accepts high-s");
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        bond.receiptSigner(r, bad);
    }

    function test_receiptSigner_shortSignature_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 64));
        bond.receiptSigner(_goodReceipt(), new bytes(64));
    }

    function test_receiptSigner_unrecoverable_reverts() public {
        // r = s = 0: ecrecover yields address(0), which ECDSA refuses
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignature.selector));
        bond.receiptSigner(_goodReceipt(), _zeroSig());
    }

    function test_eip712Domain_fields_succeeds() public view {
        (
            bytes1 fields,
            string memory name,
            string memory version,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] memory extensions
        ) = bond.eip712Domain();
        assertEq(uint256(uint8(fields)), 0x0f, "name, version, chainId, verifyingContract");
        assertEq(keccak256(bytes(name)), keccak256("SpecmarketBond"), "name");
        assertEq(keccak256(bytes(version)), keccak256("1"), "version");
        assertEq(chainId, block.chainid, "chainId");
        assertEq(verifyingContract, address(bond), "verifyingContract");
        assertEq(salt, bytes32(0), "no salt");
        assertEq(extensions.length, 0, "no extensions");
    }

    function test_constants_values_succeeds() public view {
        assertEq(
            bond.RECEIPT_TYPEHASH(),
            keccak256(
                "Receipt(address operator,bytes32 modelHash,bytes32 requestHash,bytes32 outputHash,uint32 tokenCount,uint64 issuedAt,uint64 storeNonce)"
            ),
            "RECEIPT_TYPEHASH"
        );
        assertEq(
            bond.VERDICT_TYPEHASH(),
            keccak256(
                "Verdict(uint256 challengeId,bytes32 receiptDigest,uint32 position,address challenger,bool operatorAtFault)"
            ),
            "VERDICT_TYPEHASH"
        );
        assertEq(bond.BPS(), 10_000, "BPS");
        assertEq(bond.MAX_UNBONDING_DELAY(), 5 * 365 days, "MAX_UNBONDING_DELAY");
        assertEq(bond.MAX_REFEREE_SET_DELAY(), 10 * 365 days, "MAX_REFEREE_SET_DELAY");
        assertEq(bond.MAX_REFEREES(), 32, "MAX_REFEREES");
    }

    /*//////////////////////////////////////////////////////////////
                              EQUIVOCATION
    //////////////////////////////////////////////////////////////*/

    /// @dev Two receipts for request `salt`-perturbed prompt with different outputs; reporter slashes.
    function _equivPair(bytes32 salt)
        internal
        returns (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb)
    {
        uint32[] memory p = TestUtils.tokens(uint256(salt), 4);
        a = _receipt(operator, MODEL, p, params, TestUtils.tokens(10, 3), uint64(block.timestamp));
        b = _receipt(operator, MODEL, p, params, TestUtils.tokens(11, 3), uint64(block.timestamp));
        sa = _signReceipt(OPERATOR_PK, a);
        sb = _signReceipt(OPERATOR_PK, b);
    }

    function _equivocate(bytes32 salt) internal {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb) =
            _equivPair(salt);
        vm.prank(reporter);
        bond.slashEquivocation(a, sa, b, sb);
    }

    function test_slashEquivocation_validPair_succeeds() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb) =
            _equivPair("x");
        vm.expectEmit(true, true, false, true, address(bond));
        emit SpecmarketBond.EquivocationProven(operator, a.requestHash, a.outputHash, b.outputHash);
        vm.expectEmit(true, true, true, true, address(bond));
        emit SpecmarketBond.OperatorSlashed(
            operator, reporter, SpecmarketBond.SlashReason.Equivocation, SLASH_AMOUNT, REWARD, SLASH_AMOUNT - REWARD
        );
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(reporter, REWARD);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(treasury, SLASH_AMOUNT - REWARD);
        vm.prank(reporter);
        bond.slashEquivocation(a, sa, b, sb);

        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "bond slashed");
        assertEq(bond.credits(reporter), REWARD, "reporter share");
        assertEq(bond.credits(treasury), SLASH_AMOUNT - REWARD, "treasury share");
        assertTrue(bond.equivocationSlashed(operator, a.requestHash), "pair marked");
        assertEq(address(bond).balance, 2 ether, "no ETH moved out");
    }

    function test_slashEquivocation_twice_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb) =
            _equivPair("x");
        bond.slashEquivocation(a, sa, b, sb);
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.EquivocationAlreadySlashed.selector, operator, a.requestHash)
        );
        bond.slashEquivocation(b, sb, a, sa);
        // a third receipt for the same request doesn't open a second slash either
        SpecmarketBond.Receipt memory c = _receipt(
            operator,
            MODEL,
            TestUtils.tokens(uint256(bytes32("x")), 4),
            params,
            TestUtils.tokens(12, 3),
            uint64(block.timestamp)
        );
        bytes memory sc = _signReceipt(OPERATOR_PK, c);
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.EquivocationAlreadySlashed.selector, operator, a.requestHash)
        );
        bond.slashEquivocation(a, sa, c, sc);
    }

    function test_slashEquivocation_whileUnbonding_succeeds() public {
        vm.prank(operator);
        bond.requestUnbond();
        vm.warp(block.timestamp + UNBONDING_DELAY - 1);
        _equivocate("u");
        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "slashable until withdrawn");
    }

    function test_slashEquivocation_capsAtRemainingBond_succeeds() public {
        for (uint256 i; i < 4; ++i) {
            _equivocate(bytes32(i));
        }
        assertEq(_bondOf(operator), 0, "drained");
        uint256 treasuryBefore = bond.credits(treasury);
        _equivocate("5th");
        assertEq(bond.credits(treasury), treasuryBefore, "nothing left to slash");
    }

    function test_slashEquivocation_operatorsDiffer_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b,) = _equivPair("x");
        b.operator = vm.addr(OTHER_PK);
        bytes memory sb = _signReceipt(OTHER_PK, b);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ReceiptOperatorsDiffer.selector, operator, b.operator));
        bond.slashEquivocation(a, sa, b, sb);
    }

    function test_slashEquivocation_requestHashesDiffer_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b,) = _equivPair("x");
        b.requestHash = keccak256("other request");
        bytes memory sb = _signReceipt(OPERATOR_PK, b);
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.RequestHashesDiffer.selector, a.requestHash, b.requestHash)
        );
        bond.slashEquivocation(a, sa, b, sb);
    }

    function test_slashEquivocation_modelHashesDiffer_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b,) = _equivPair("x");
        b.modelHash = keccak256("other model");
        bytes memory sb = _signReceipt(OPERATOR_PK, b);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ModelHashesDiffer.selector, MODEL, b.modelHash));
        bond.slashEquivocation(a, sa, b, sb);
    }

    function test_slashEquivocation_otherStoreNonce_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b,) = _equivPair("x");
        // a second receipt store of the same key (a lost store, a replica): no equivocation
        b.storeNonce = a.storeNonce + 1;
        bytes memory sb = _signReceipt(OPERATOR_PK, b);
        uint256 before = _bondOf(operator);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.StoreNoncesDiffer.selector, a.storeNonce, b.storeNonce));
        bond.slashEquivocation(a, sa, b, sb);
        assertEq(_bondOf(operator), before, "not slashed");
    }

    function test_slashEquivocation_sameOutput_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa,,) = _equivPair("x");
        SpecmarketBond.Receipt memory b = _receipt(
            operator, MODEL, TestUtils.tokens(uint256(bytes32("x")), 4), params, TestUtils.tokens(10, 3), a.issuedAt + 5
        );
        // a re-signed identical answer (other timestamp) is not equivocation
        assertEq(b.outputHash, a.outputHash, "same output");
        assertTrue(bond.receiptDigest(a) != bond.receiptDigest(b), "different receipts");
        bytes memory sb = _signReceipt(OPERATOR_PK, b);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.OutputHashesEqual.selector, a.outputHash));
        bond.slashEquivocation(a, sa, b, sb);
    }

    function test_slashEquivocation_notRegistered_reverts() public {
        address ghost = vm.addr(OTHER_PK);
        uint32[] memory p = TestUtils.tokens(3, 4);
        SpecmarketBond.Receipt memory a =
            _receipt(ghost, MODEL, p, params, TestUtils.tokens(10, 3), uint64(block.timestamp));
        SpecmarketBond.Receipt memory b =
            _receipt(ghost, MODEL, p, params, TestUtils.tokens(11, 3), uint64(block.timestamp));
        bytes memory sa = _signReceipt(OTHER_PK, a);
        bytes memory sb = _signReceipt(OTHER_PK, b);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotRegistered.selector, ghost));
        bond.slashEquivocation(a, sa, b, sb);
    }

    function test_slashEquivocation_forgedSignature_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b,) = _equivPair("x");
        bytes memory forged = _signReceipt(OTHER_PK, b); // not the operator's key
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.InvalidReceiptSigner.selector, operator, vm.addr(OTHER_PK))
        );
        bond.slashEquivocation(a, sa, b, forged);
    }

    function test_slashEquivocation_highS_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb) =
            _equivPair("x");
        bytes memory bad = _highS(sb);
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        bond.slashEquivocation(a, sa, b, bad);
    }

    function test_slashEquivocation_otherChainId_reverts() public {
        uint256 chain = block.chainid;
        vm.chainId(chain + 1);
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b, bytes memory sb) =
            _equivPair("x");
        vm.chainId(chain);
        address recovered = _recover(bond.receiptDigest(a), sa);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.InvalidReceiptSigner.selector, operator, recovered));
        bond.slashEquivocation(a, sa, b, sb);
    }

    function test_slashEquivocation_shortSignature_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b,) = _equivPair("x");
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 64));
        bond.slashEquivocation(a, sa, b, new bytes(64));
    }

    function test_slashEquivocation_unrecoverableSignature_reverts() public {
        (SpecmarketBond.Receipt memory a, bytes memory sa, SpecmarketBond.Receipt memory b,) = _equivPair("x");
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignature.selector));
        bond.slashEquivocation(a, sa, b, _zeroSig());
    }

    /*//////////////////////////////////////////////////////////////
                               CHALLENGE
    //////////////////////////////////////////////////////////////*/

    function test_challenge_validReceipt_succeeds() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        bytes32 digest = bond.receiptDigest(r);
        vm.expectEmit(true, true, true, true, address(bond));
        emit SpecmarketBond.ChallengeOpened(1, operator, challenger, digest, MODEL, 3, params, prompt, output);
        uint256 id = _challenge(r, sig, 3);

        assertEq(id, 1, "first id");
        assertEq(bond.nextChallengeId(), 2, "next id");
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        assertEq(c.challenger, challenger, "challenger");
        assertEq(c.operator, operator, "operator");
        assertEq(c.bond, CHALLENGER_BOND, "bond");
        assertEq(c.createdAt, block.timestamp, "createdAt");
        assertEq(c.position, 3, "position");
        assertTrue(c.status == SpecmarketBond.ChallengeStatus.Open, "open");
        assertEq(c.receiptDigest, digest, "digest");
        assertEq(c.refereeEpoch, 1, "decided by epoch 1");
        assertEq(_openOf(operator), 1, "openChallenges");
        assertEq(address(bond).balance, 2 ether + CHALLENGER_BOND, "bond held");
    }

    function test_challenge_atWindowEnd_succeeds() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.warp(r.issuedAt + CHALLENGE_WINDOW);
        _challenge(r, sig, 0);
    }

    function test_challenge_lastPosition_succeeds() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        _challenge(r, _signReceipt(OPERATOR_PK, r), uint32(output.length - 1));
    }

    function test_challenge_whileUnbonding_succeeds() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.prank(operator);
        bond.requestUnbond();
        _challenge(r, sig, 0);
        assertEq(_openOf(operator), 1, "open");
    }

    function test_challenge_bondTooLow_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.WrongChallengerBond.selector, CHALLENGER_BOND - 1, CHALLENGER_BOND)
        );
        vm.prank(challenger);
        bond.challenge{value: CHALLENGER_BOND - 1}(r, sig, prompt, params, output, 0);
    }

    function test_challenge_bondTooHigh_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.WrongChallengerBond.selector, CHALLENGER_BOND + 1, CHALLENGER_BOND)
        );
        vm.prank(challenger);
        bond.challenge{value: CHALLENGER_BOND + 1}(r, sig, prompt, params, output, 0);
    }

    function test_challenge_notRegistered_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.operator = vm.addr(OTHER_PK);
        bytes memory sig = _signReceipt(OTHER_PK, r);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotRegistered.selector, r.operator));
        _challenge(r, sig, 0);
    }

    function test_challenge_modelHashMismatch_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.modelHash = keccak256("uncommitted model");
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ModelHashMismatch.selector, MODEL, r.modelHash));
        _challenge(r, sig, 0);
    }

    function test_challenge_requestHashMismatch_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        params.seed = 43; // the challenger claims other params than the receipt committed to
        vm.expectRevert(
            abi.encodeWithSelector(
                SpecmarketBond.RequestHashMismatch.selector, _refHashRequest(prompt, params), r.requestHash
            )
        );
        _challenge(r, sig, 0);
    }

    function test_challenge_promptMismatch_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        prompt.push(7);
        vm.expectRevert(
            abi.encodeWithSelector(
                SpecmarketBond.RequestHashMismatch.selector, _refHashRequest(prompt, params), r.requestHash
            )
        );
        _challenge(r, sig, 0);
    }

    function test_challenge_outputHashMismatch_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        output[2] += 1;
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.OutputHashMismatch.selector, _refHashTokens(output), r.outputHash)
        );
        _challenge(r, sig, 0);
    }

    function test_challenge_tokenCountMismatch_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.tokenCount = uint32(output.length + 1);
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.TokenCountMismatch.selector, output.length, r.tokenCount));
        _challenge(r, sig, 0);
    }

    function test_challenge_positionOutOfRange_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        uint32 pos = uint32(output.length);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.PositionOutOfRange.selector, pos, output.length));
        _challenge(r, sig, pos);
    }

    function test_challenge_emptyOutput_reverts() public {
        delete output;
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.PositionOutOfRange.selector, 0, 0));
        _challenge(r, sig, 0);
    }

    function test_challenge_afterWindow_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        uint256 windowEnd = r.issuedAt + CHALLENGE_WINDOW;
        vm.warp(windowEnd + 1);
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.ChallengeWindowClosed.selector, r.issuedAt, windowEnd, windowEnd + 1)
        );
        _challenge(r, sig, 0);
    }

    function test_challenge_receiptFromFuture_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        r.issuedAt = uint64(block.timestamp + 1);
        bytes memory sig = _signReceipt(OPERATOR_PK, r);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ReceiptFromFuture.selector, r.issuedAt, block.timestamp));
        _challenge(r, sig, 0);
    }

    function test_challenge_forgedSignature_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes memory sig = _signReceipt(OTHER_PK, r);
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.InvalidReceiptSigner.selector, operator, vm.addr(OTHER_PK))
        );
        _challenge(r, sig, 0);
    }

    function test_challenge_highS_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes memory bad = _highS(_signReceipt(OPERATOR_PK, r));
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        _challenge(r, bad, 0);
    }

    function test_challenge_receiptForOtherChainId_reverts() public {
        SpecmarketBond.Receipt memory r = _goodReceipt();
        uint256 chain = block.chainid;
        vm.chainId(1);
        bytes memory sig = _signReceipt(OPERATOR_PK, r); // digest under chain 1
        vm.chainId(chain);
        address recovered = _recover(bond.receiptDigest(r), sig);
        assertTrue(recovered != operator, "different digest, different signer");
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.InvalidReceiptSigner.selector, operator, recovered));
        _challenge(r, sig, 0);
    }

    function test_challenge_receiptForOtherContract_reverts() public {
        SpecmarketBond other = new SpecmarketBond(owner, _config(), refAddrs, 2);
        SpecmarketBond.Receipt memory r = _goodReceipt();
        bytes memory sig = TestUtils.sign(OPERATOR_PK, other.receiptDigest(r));
        address recovered = _recover(bond.receiptDigest(r), sig);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.InvalidReceiptSigner.selector, operator, recovered));
        _challenge(r, sig, 0);
    }

    function test_challenge_receiptAlreadySlashed_reverts() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        uint256 id = _challenge(r, sig, 1);
        bond.resolve(id, true, _quorum(id, true, 2));
        bytes32 digest = bond.receiptDigest(r);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ReceiptAlreadySlashed.selector, digest));
        _challenge(r, sig, 2);
    }

    function test_challenge_shortSignature_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 66));
        _challenge(_goodReceipt(), new bytes(66), 0);
    }

    function test_challenge_unrecoverableSignature_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignature.selector));
        _challenge(_goodReceipt(), _zeroSig(), 0);
    }

    function test_getChallenge_unknownId_succeeds() public view {
        SpecmarketBond.Challenge memory c = bond.getChallenge(1);
        assertTrue(c.status == SpecmarketBond.ChallengeStatus.None, "unused id");
        assertEq(c.challenger, address(0), "empty record");
        assertEq(c.bond, 0, "no bond");
        assertEq(c.refereeEpoch, 0, "no epoch");
    }

    function test_challenge_snapshotsRefereeEpoch_succeeds() public {
        uint256 id1 = _openChallenge();
        _activateSet(_addrs(3), 1);
        uint256 id2 = _openChallenge();
        assertEq(bond.getChallenge(id1).refereeEpoch, 1, "opened under epoch 1");
        assertEq(bond.getChallenge(id2).refereeEpoch, 2, "opened under epoch 2");
        assertEq(bond.getChallenge(id1).bond, CHALLENGER_BOND, "bond");
    }

    /*//////////////////////////////////////////////////////////////
                                RESOLVE
    //////////////////////////////////////////////////////////////*/

    function test_resolve_operatorAtFault_succeeds() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 2);
        vm.expectEmit(true, true, true, true, address(bond));
        emit SpecmarketBond.OperatorSlashed(
            operator, challenger, SpecmarketBond.SlashReason.WrongToken, SLASH_AMOUNT, REWARD, SLASH_AMOUNT - REWARD
        );
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(challenger, REWARD);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(treasury, SLASH_AMOUNT - REWARD);
        vm.expectEmit(true, true, false, true, address(bond));
        emit SpecmarketBond.ChallengeResolved(id, operator, true, SLASH_AMOUNT);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(challenger, CHALLENGER_BOND);
        vm.prank(reporter); // anyone may submit the verdict
        bond.resolve(id, true, sigs);

        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "slashed");
        assertEq(bond.credits(challenger), CHALLENGER_BOND + REWARD, "bond back + reward");
        assertEq(bond.credits(treasury), SLASH_AMOUNT - REWARD, "treasury");
        assertEq(_openOf(operator), 0, "closed");
        assertTrue(bond.getChallenge(id).status == SpecmarketBond.ChallengeStatus.OperatorAtFault, "status");
        assertTrue(bond.receiptSlashed(bond.getChallenge(id).receiptDigest), "receipt marked");
    }

    function test_resolve_operatorCleared_succeeds() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, false, 3); // more than the threshold is fine
        vm.expectEmit(true, true, false, true, address(bond));
        emit SpecmarketBond.ChallengeResolved(id, operator, false, 0);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(operator, CHALLENGER_BOND);
        bond.resolve(id, false, sigs);

        assertEq(_bondOf(operator), 2 ether, "not slashed");
        assertEq(bond.credits(operator), CHALLENGER_BOND, "false challenge pays the operator");
        assertEq(bond.credits(challenger), 0, "challenger loses its bond");
        assertEq(_openOf(operator), 0, "closed");
        assertTrue(bond.getChallenge(id).status == SpecmarketBond.ChallengeStatus.OperatorCleared, "status");
    }

    function test_resolve_atDeadline_succeeds() public {
        uint256 id = _openChallenge();
        vm.warp(block.timestamp + RESOLVE_TIMEOUT);
        bond.resolve(id, false, _quorum(id, false, 2));
    }

    function test_resolve_secondFaultOnSameReceipt_succeeds() public {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        uint256 id1 = _challenge(r, sig, 1);
        uint256 id2 = _challenge(r, sig, 4);
        bond.resolve(id1, true, _quorum(id1, true, 2));
        vm.expectEmit(true, true, false, true, address(bond));
        emit SpecmarketBond.ChallengeResolved(id2, operator, true, 0);
        bond.resolve(id2, true, _quorum(id2, true, 2));
        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "a receipt is slashed once");
        assertEq(bond.credits(challenger), 2 * CHALLENGER_BOND + REWARD, "both bonds back, one reward");
    }

    function test_resolve_slashCappedAtBond_succeeds() public {
        for (uint256 i; i < 3; ++i) {
            _equivocate(bytes32(i));
        }
        assertEq(_bondOf(operator), 0.5 ether, "0.5 left");
        uint256 id = _openChallenge();
        bond.resolve(id, true, _quorum(id, true, 2));
        assertEq(_bondOf(operator), 0, "takes what is left");
    }

    function test_resolve_unknownId_reverts() public {
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.ChallengeNotOpen.selector, 99, SpecmarketBond.ChallengeStatus.None)
        );
        bond.resolve(99, true, new bytes[](0));
    }

    function test_resolve_alreadyResolved_reverts() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 2);
        bond.resolve(id, true, sigs);
        vm.expectRevert(
            abi.encodeWithSelector(
                SpecmarketBond.ChallengeNotOpen.selector, id, SpecmarketBond.ChallengeStatus.OperatorAtFault
            )
        );
        bond.resolve(id, true, sigs);
    }

    function test_resolve_afterTimeout_reverts() public {
        uint256 id = _openChallenge();
        uint256 deadline = block.timestamp + RESOLVE_TIMEOUT;
        bytes[] memory sigs = _quorum(id, true, 2);
        vm.warp(deadline + 1);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ResolveWindowClosed.selector, id, deadline, deadline + 1));
        bond.resolve(id, true, sigs);
    }

    function test_resolve_belowThreshold_reverts() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 1);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, 1, 2));
        bond.resolve(id, true, sigs);
    }

    function test_resolve_noSignatures_reverts() public {
        uint256 id = _openChallenge();
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, 0, 2));
        bond.resolve(id, true, new bytes[](0));
    }

    function test_resolve_duplicateSigner_reverts() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 2);
        sigs[1] = sigs[0];
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.SignersNotAscending.selector, refAddrs[0], refAddrs[0]));
        bond.resolve(id, true, sigs);
    }

    function test_resolve_unsortedSigners_reverts() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 2);
        (sigs[0], sigs[1]) = (sigs[1], sigs[0]);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.SignersNotAscending.selector, refAddrs[1], refAddrs[0]));
        bond.resolve(id, true, sigs);
    }

    function test_resolve_nonRefereeSigner_reverts() public {
        uint256 id = _openChallenge();
        uint256[] memory pks = new uint256[](2);
        pks[0] = refPks[0];
        pks[1] = 0xDEAD; // not a referee
        pks = TestUtils.sortByAddress(pks);
        bytes[] memory sigs = _verdictSigs(bond, id, true, pks);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotReferee.selector, vm.addr(0xDEAD)));
        bond.resolve(id, true, sigs);
    }

    /// @dev Expects `resolve(id, fault, sigs)` to revert with NotReferee(first signer as recovered
    ///      from the challenge's true verdict digest).
    function _expectForeignVerdict(uint256 id, bool fault, bytes[] memory sigs) internal {
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        address first = _recover(bond.verdictDigest(id, c.receiptDigest, c.position, c.challenger, fault), sigs[0]);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotReferee.selector, first));
        bond.resolve(id, fault, sigs);
    }

    /// @dev The first `m` epoch-1 referees' signatures over a verdict with the given fields.
    function _quorumFor(uint256 id, bytes32 digest, uint32 position, address who, bool fault, uint256 m)
        internal
        returns (bytes[] memory)
    {
        uint256[] memory pks = new uint256[](m);
        for (uint256 i; i < m; ++i) {
            pks[i] = refPks[i];
        }
        return _signDigest(bond.verdictDigest(id, digest, position, who, fault), pks);
    }

    function test_resolve_verdictForOtherReceiptDigest_reverts() public {
        uint256 id = _openChallenge();
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        bytes32 other = keccak256("another receipt");
        _expectForeignVerdict(id, true, _quorumFor(id, other, c.position, c.challenger, true, 2));
        assertEq(_bondOf(operator), 2 ether, "not slashed");
    }

    function test_resolve_verdictForOtherPosition_reverts() public {
        uint256 id = _openChallenge();
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        _expectForeignVerdict(id, true, _quorumFor(id, c.receiptDigest, c.position + 1, c.challenger, true, 2));
        assertEq(_bondOf(operator), 2 ether, "not slashed");
    }

    function test_resolve_verdictForOtherChallenger_reverts() public {
        uint256 id = _openChallenge();
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        _expectForeignVerdict(id, true, _quorumFor(id, c.receiptDigest, c.position, reporter, true, 2));
        assertEq(_bondOf(operator), 2 ether, "not slashed");
    }

    /// A reorg replaces challenge 1 (at fault) with another challenge 1 on the same receipt, by
    /// another challenger at another position: the referees' at-fault verdict for the first one
    /// doesn't land on it.
    function test_resolve_verdictAfterReorg_reverts() public {
        uint256 beforeFork = vmx.snapshotState();
        uint256 id = _openChallenge(); // challenger, position 3
        bytes[] memory sigs = _quorum(id, true, 2);
        vmx.revertToState(beforeFork);

        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.deal(reporter, CHALLENGER_BOND);
        vm.prank(reporter);
        uint256 reorged = bond.challenge{value: CHALLENGER_BOND}(r, sig, prompt, params, output, 5);
        assertEq(reorged, id, "the same id");
        _expectForeignVerdict(id, true, sigs);
        bond.resolve(id, false, _quorum(id, false, 2)); // its own referees clear it
        assertEq(_bondOf(operator), 2 ether, "not slashed");
    }

    /// The owner proposes a 1-of-1 set of its own key: until the delay passes and the set is
    /// activated, the owner's verdicts count for nothing, and they never count for a challenge
    /// opened before the activation.
    function test_resolve_ownerSoloSetBeforeDelay_reverts() public {
        uint256 ownerPk = 0x5E1F;
        address[] memory solo = new address[](1);
        solo[0] = vm.addr(ownerPk);
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(solo, 1);
        uint256[] memory ownerKey = new uint256[](1);
        ownerKey[0] = ownerPk;

        uint256 id = _openChallenge();
        bytes[] memory sigs = _verdictSigs(bond, id, true, ownerKey);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, 1, 2));
        bond.resolve(id, true, sigs);

        vm.warp(eta - 1);
        uint256 late = _openChallenge(); // still epoch 1
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.RefereeSetNotReady.selector, eta, eta - 1));
        bond.activateRefereeSet();
        sigs = _verdictSigs(bond, late, true, ownerKey);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, 1, 2));
        bond.resolve(late, true, sigs);

        vm.warp(eta);
        bond.activateRefereeSet();
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, 1, 2));
        bond.resolve(late, true, sigs); // opened under epoch 1: the owner's epoch 2 can't decide it
        assertEq(_bondOf(operator), 2 ether, "not slashed");
    }

    /// A challenge opened under epoch 1 is decided by epoch 1's quorum after epoch 2 (which removed
    /// every epoch-1 referee) has activated; epoch 2's signatures are refused for it.
    function test_resolve_openChallengeKeepsItsEpoch_succeeds() public {
        (uint256[] memory pks2, address[] memory addrs2) = _refereeKeys(0xE1, 3);
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(addrs2, 2);
        vm.warp(eta - 1 days);
        uint256 id = _openChallenge();
        vm.warp(eta);
        bond.activateRefereeSet();
        assertFalse(bond.isReferee(refAddrs[0]), "removed from the current set");

        _expectForeignVerdictSigners(id, pks2);
        bond.resolve(id, true, _quorum(id, true, 2)); // epoch 1's referees, removed since
        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "decided by epoch 1");
    }

    /// Epoch 2's quorum (threshold 3) decides challenges opened after its activation; epoch 1's
    /// referees and threshold no longer count for them.
    function test_resolve_challengeAfterActivationUsesNewEpoch_succeeds() public {
        (uint256[] memory pks2, address[] memory addrs2) = _refereeKeys(0xE1, 3);
        _activateSet(addrs2, 3);
        uint256 id = _openChallenge();
        assertEq(bond.getChallenge(id).refereeEpoch, 2, "epoch 2");
        bytes[] memory old = _quorum(id, true, 3);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotReferee.selector, refAddrs[0]));
        bond.resolve(id, true, old);
        bytes[] memory two = _verdictSigs(bond, id, true, _prefixOf(pks2, 2));
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, 2, 3));
        bond.resolve(id, true, two);
        bond.resolve(id, true, _verdictSigs(bond, id, true, pks2));
        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "decided by epoch 2");
    }

    /// Lowering the threshold in a later epoch doesn't lower it for challenges already open.
    function test_resolve_thresholdOfChallengeEpoch_reverts() public {
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(refAddrs, 1);
        vm.warp(eta - 1 days);
        uint256 id = _openChallenge();
        vm.warp(eta);
        bond.activateRefereeSet();
        assertEq(bond.threshold(), 1, "epoch 2: 1 of 3");
        bytes[] memory one = _quorum(id, true, 1);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.BelowThreshold.selector, 1, 2));
        bond.resolve(id, true, one);
    }

    function _expectForeignVerdictSigners(uint256 id, uint256[] memory pks) internal {
        bytes[] memory sigs = _verdictSigs(bond, id, true, pks);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotReferee.selector, vm.addr(pks[0])));
        bond.resolve(id, true, sigs);
    }

    function test_resolve_signaturesForOppositeVerdict_reverts() public {
        uint256 id = _openChallenge();
        _expectForeignVerdict(id, true, _quorum(id, false, 2)); // referees said: not at fault
    }

    /// Another challenge's id with this challenge's fields (as after a reorg that renumbered it).
    function test_resolve_signaturesForOtherChallenge_reverts() public {
        uint256 id = _openChallenge();
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        _expectForeignVerdict(id, true, _quorumFor(id + 1, c.receiptDigest, c.position, c.challenger, true, 2));
    }

    function test_resolve_verdictForOtherChainId_reverts() public {
        uint256 id = _openChallenge();
        uint256 chain = block.chainid;
        vm.chainId(chain + 7);
        bytes[] memory sigs = _quorum(id, true, 2);
        vm.chainId(chain);
        _expectForeignVerdict(id, true, sigs);
    }

    function test_resolve_highSVerdict_reverts() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 2);
        sigs[1] = _highS(sigs[1]);
        (,, bytes32 s) = _split(sigs[1]);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        bond.resolve(id, true, sigs);
    }

    function test_resolve_shortSignature_reverts() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 2);
        sigs[1] = new bytes(64);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 64));
        bond.resolve(id, true, sigs);
    }

    function test_resolve_unrecoverableSignature_reverts() public {
        uint256 id = _openChallenge();
        bytes[] memory sigs = _quorum(id, true, 2);
        sigs[0] = _zeroSig();
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignature.selector));
        bond.resolve(id, true, sigs);
    }

    /*//////////////////////////////////////////////////////////////
                             REFUND EXPIRED
    //////////////////////////////////////////////////////////////*/

    function test_refundExpired_afterTimeout_succeeds() public {
        uint256 id = _openChallenge();
        vm.warp(block.timestamp + RESOLVE_TIMEOUT + 1);
        vm.expectEmit(true, true, false, true, address(bond));
        emit SpecmarketBond.ChallengeExpired(id, challenger, CHALLENGER_BOND);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Credited(challenger, CHALLENGER_BOND);
        vm.prank(reporter); // anyone may trigger it
        bond.refundExpired(id);
        assertEq(bond.credits(challenger), CHALLENGER_BOND, "refunded");
        assertEq(_bondOf(operator), 2 ether, "no slash");
        assertEq(_openOf(operator), 0, "closed");
        assertTrue(bond.getChallenge(id).status == SpecmarketBond.ChallengeStatus.Expired, "status");
    }

    function test_refundExpired_atDeadline_reverts() public {
        uint256 id = _openChallenge();
        uint256 deadline = block.timestamp + RESOLVE_TIMEOUT;
        vm.warp(deadline);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.ResolveWindowNotClosed.selector, id, deadline, deadline));
        bond.refundExpired(id);
    }

    function test_refundExpired_notOpen_reverts() public {
        uint256 id = _openChallenge();
        bond.resolve(id, false, _quorum(id, false, 2));
        vm.warp(block.timestamp + RESOLVE_TIMEOUT + 1);
        vm.expectRevert(
            abi.encodeWithSelector(
                SpecmarketBond.ChallengeNotOpen.selector, id, SpecmarketBond.ChallengeStatus.OperatorCleared
            )
        );
        bond.refundExpired(id);
    }

    function test_refundExpired_twice_reverts() public {
        uint256 id = _openChallenge();
        vm.warp(block.timestamp + RESOLVE_TIMEOUT + 1);
        bond.refundExpired(id);
        vm.expectRevert(
            abi.encodeWithSelector(SpecmarketBond.ChallengeNotOpen.selector, id, SpecmarketBond.ChallengeStatus.Expired)
        );
        bond.refundExpired(id);
    }

    /*//////////////////////////////////////////////////////////////
                                REFEREES
    //////////////////////////////////////////////////////////////*/

    /// @dev `n` distinct non-zero addresses that hold no key of the fixture.
    function _addrs(uint256 n) internal pure returns (address[] memory a) {
        a = new address[](n);
        for (uint256 i; i < n; ++i) {
            a[i] = address(uint160(0xF000 + i));
        }
    }

    function _prefixOf(uint256[] memory pks, uint256 n) internal pure returns (uint256[] memory out) {
        out = new uint256[](n);
        for (uint256 i; i < n; ++i) {
            out[i] = pks[i];
        }
    }

    function _expectProposeRevert(address[] memory members, uint256 m, bytes memory err) internal {
        vm.expectRevert(err);
        vm.prank(owner);
        bond.proposeRefereeSet(members, m);
    }

    function test_proposeRefereeSet_byOwner_succeeds() public {
        address[] memory next = _addrs(4);
        uint256 eta = block.timestamp + REFEREE_SET_DELAY;
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.RefereeSetProposed(2, next, 3, eta);
        vm.prank(owner);
        assertEq(bond.proposeRefereeSet(next, 3), eta, "eta");

        (address[] memory members, uint256 m, uint256 eta_) = bond.pendingRefereeSet();
        assertEq(members.length, 4, "pending members");
        for (uint256 i; i < 4; ++i) {
            assertEq(members[i], next[i], "pending member");
            assertFalse(bond.isReferee(next[i]), "not a referee yet");
            assertFalse(bond.isRefereeAt(2, next[i]), "epoch 2 doesn't exist yet");
        }
        assertEq(m, 3, "pending threshold");
        assertEq(eta_, eta, "pending eta");
        assertEq(bond.refereeEpoch(), 1, "still epoch 1");
        assertEq(bond.threshold(), 2, "epoch 1's threshold");
        assertEq(bond.refereesAt(2).length, 0, "refereesAt(2) empty");
        assertEq(bond.thresholdAt(2), 0, "thresholdAt(2) zero");
    }

    /// A set may keep current referees: epochs are independent sets, not edits.
    function test_proposeRefereeSet_overlappingCurrentSet_succeeds() public {
        address[] memory next = new address[](2);
        (next[0], next[1]) = (refAddrs[2], address(0xF00D));
        _activateSet(next, 2);
        assertTrue(bond.isReferee(refAddrs[2]) && bond.isReferee(address(0xF00D)), "members");
        assertFalse(bond.isReferee(refAddrs[0]), "dropped");
        assertTrue(bond.isRefereeAt(1, refAddrs[0]), "still in epoch 1");
        assertEq(bond.refereeCount(), 2, "count");
    }

    function test_proposeRefereeSet_maxReferees_succeeds() public {
        vm.prank(owner);
        bond.proposeRefereeSet(_addrs(32), 32);
        (address[] memory members,,) = bond.pendingRefereeSet();
        assertEq(members.length, 32, "32 members");
    }

    function test_proposeRefereeSet_notOwner_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, reporter));
        vm.prank(reporter);
        bond.proposeRefereeSet(_addrs(1), 1);
    }

    function test_proposeRefereeSet_zeroReferee_reverts() public {
        address[] memory next = _addrs(3);
        next[1] = address(0);
        _expectProposeRevert(next, 2, abi.encodeWithSelector(SpecmarketBond.ZeroReferee.selector));
    }

    function test_proposeRefereeSet_duplicate_reverts() public {
        address[] memory next = _addrs(3);
        next[2] = next[0];
        _expectProposeRevert(next, 2, abi.encodeWithSelector(SpecmarketBond.DuplicateReferee.selector, next[0]));
    }

    function test_proposeRefereeSet_tooMany_reverts() public {
        _expectProposeRevert(_addrs(33), 2, abi.encodeWithSelector(SpecmarketBond.TooManyReferees.selector, 33, 32));
    }

    function test_proposeRefereeSet_zeroThreshold_reverts() public {
        _expectProposeRevert(_addrs(3), 0, abi.encodeWithSelector(SpecmarketBond.InvalidThreshold.selector, 0, 3));
    }

    function test_proposeRefereeSet_thresholdAboveCount_reverts() public {
        _expectProposeRevert(_addrs(3), 4, abi.encodeWithSelector(SpecmarketBond.InvalidThreshold.selector, 4, 3));
    }

    function test_proposeRefereeSet_empty_reverts() public {
        _expectProposeRevert(_addrs(0), 1, abi.encodeWithSelector(SpecmarketBond.InvalidThreshold.selector, 1, 0));
    }

    function test_proposeRefereeSet_etaAboveUint64_reverts() public {
        uint256 eta = uint256(type(uint64).max) + 1;
        vm.warp(eta - REFEREE_SET_DELAY); // ~584 billion years from now
        vm.expectRevert(abi.encodeWithSelector(SafeCast.SafeCastOverflowedUintDowncast.selector, 64, eta));
        vm.prank(owner);
        bond.proposeRefereeSet(_addrs(1), 1);
    }

    /// A new proposal replaces the pending one entirely and restarts the delay: the owner can't
    /// propose early and swap the members in at the old eta.
    function test_proposeRefereeSet_replacesPending_succeeds() public {
        address[] memory first = _addrs(3);
        vm.prank(owner);
        uint256 eta1 = bond.proposeRefereeSet(first, 2);
        vm.warp(eta1 - 1);
        address[] memory second = new address[](2);
        (second[0], second[1]) = (first[1], address(0xBEEF));
        uint256 eta2 = block.timestamp + REFEREE_SET_DELAY;
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.RefereeSetProposed(2, second, 1, eta2);
        vm.prank(owner);
        bond.proposeRefereeSet(second, 1);

        vm.warp(eta1);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.RefereeSetNotReady.selector, eta2, eta1));
        bond.activateRefereeSet();
        vm.warp(eta2);
        bond.activateRefereeSet();
        assertEq(bond.refereeCount(), 2, "the second proposal");
        assertEq(bond.threshold(), 1, "its threshold");
        assertFalse(bond.isReferee(first[0]) || bond.isReferee(first[2]), "the first proposal's other members are gone");
        assertTrue(bond.isReferee(first[1]) && bond.isReferee(address(0xBEEF)), "the second's members");
    }

    function test_cancelRefereeSet_byOwner_succeeds() public {
        address[] memory next = _addrs(2);
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(next, 1);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.RefereeSetCancelled(2);
        vm.prank(owner);
        bond.cancelRefereeSet();
        (address[] memory members, uint256 m, uint256 eta_) = bond.pendingRefereeSet();
        assertEq(members.length + m + eta_, 0, "nothing pending");
        vm.warp(eta);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NoPendingRefereeSet.selector));
        bond.activateRefereeSet();
        // a later proposal for epoch 2 starts from an empty set
        address[] memory other = _addrs(1);
        _activateSet(other, 1);
        assertEq(bond.refereeCount(), 1, "only the new proposal's members");
        assertTrue(bond.isReferee(next[0]), "0xF000 proposed again");
        assertFalse(bond.isReferee(next[1]), "0xF001 cancelled");
    }

    function test_cancelRefereeSet_noPending_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NoPendingRefereeSet.selector));
        vm.prank(owner);
        bond.cancelRefereeSet();
    }

    function test_cancelRefereeSet_notOwner_reverts() public {
        vm.prank(owner);
        bond.proposeRefereeSet(_addrs(1), 1);
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, reporter));
        vm.prank(reporter);
        bond.cancelRefereeSet();
    }

    function test_activateRefereeSet_atEta_succeeds() public {
        address[] memory next = _addrs(3);
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(next, 2);
        vm.warp(eta);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.RefereeSetActivated(2, next, 2);
        vm.prank(reporter); // anyone
        bond.activateRefereeSet();

        assertEq(bond.refereeEpoch(), 2, "epoch 2");
        assertEq(bond.threshold(), 2, "threshold");
        assertEq(bond.thresholdAt(2), 2, "thresholdAt(2)");
        assertEq(bond.thresholdAt(1), 2, "thresholdAt(1) kept");
        assertEq(bond.refereeCount(), 3, "count");
        address[] memory listed = bond.referees();
        for (uint256 i; i < 3; ++i) {
            assertEq(listed[i], next[i], "referees()");
            assertEq(bond.refereesAt(2)[i], next[i], "refereesAt(2)");
            assertEq(bond.refereesAt(1)[i], refAddrs[i], "refereesAt(1) kept");
            assertTrue(bond.isReferee(next[i]) && bond.isRefereeAt(2, next[i]), "new member");
            assertFalse(bond.isReferee(refAddrs[i]), "old member out of the current set");
            assertTrue(bond.isRefereeAt(1, refAddrs[i]), "old member still in epoch 1");
        }
        (address[] memory members,, uint256 eta_) = bond.pendingRefereeSet();
        assertEq(members.length + eta_, 0, "nothing pending");
    }

    function test_activateRefereeSet_beforeEta_reverts() public {
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(_addrs(1), 1);
        vm.warp(eta - 1);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.RefereeSetNotReady.selector, eta, eta - 1));
        bond.activateRefereeSet();
    }

    function test_activateRefereeSet_noPending_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NoPendingRefereeSet.selector));
        bond.activateRefereeSet();
    }

    function test_activateRefereeSet_twice_reverts() public {
        _activateSet(_addrs(1), 1);
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NoPendingRefereeSet.selector));
        bond.activateRefereeSet();
    }

    /// Epochs count up: a third set is epoch 3, and every earlier epoch stays readable.
    function test_activateRefereeSet_thirdEpoch_succeeds() public {
        _activateSet(_addrs(1), 1);
        address[] memory third = _addrs(2);
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(third, 2);
        vm.warp(eta);
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.RefereeSetActivated(3, third, 2);
        bond.activateRefereeSet();
        assertEq(bond.refereeEpoch(), 3, "epoch 3");
        assertEq(bond.thresholdAt(1) * 100 + bond.thresholdAt(2) * 10 + bond.thresholdAt(3), 212, "thresholds");
        assertEq(bond.refereesAt(2).length, 1, "epoch 2 kept");
        assertEq(bond.refereesAt(0).length + bond.thresholdAt(0), 0, "no epoch 0");
    }

    /// An operator that requests unbonding when a proposal appears withdraws its bond before the
    /// proposed set can judge anything (refereeSetDelay > unbondingDelay), even if that set is
    /// the owner's own 1-of-1.
    function test_requestUnbond_onProposal_withdrawsBeforeActivation_succeeds() public {
        address[] memory solo = new address[](1);
        solo[0] = vm.addr(0x5E1F); // the owner's key
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(solo, 1);

        vm.prank(operator);
        bond.requestUnbond();
        vm.warp(block.timestamp + UNBONDING_DELAY);
        assertTrue(block.timestamp < eta, "before the set can be activated");
        vm.prank(operator);
        bond.withdrawBond();
        uint256 before = operator.balance;
        vm.prank(operator);
        bond.withdraw();
        assertEq(operator.balance, before + 2 ether, "the whole bond is out");

        vm.warp(eta);
        bond.activateRefereeSet();
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NotRegistered.selector, operator));
        _challenge(r, sig, 0);
    }

    function test_pendingRefereeSet_none_succeeds() public view {
        (address[] memory members, uint256 m, uint256 eta) = bond.pendingRefereeSet();
        assertEq(members.length, 0, "no members");
        assertEq(m, 0, "no threshold");
        assertEq(eta, 0, "no eta");
    }

    function test_transferOwnership_twoStep_succeeds() public {
        vm.prank(owner);
        bond.transferOwnership(reporter);
        assertEq(bond.owner(), owner, "not yet");
        assertEq(bond.pendingOwner(), reporter, "pending");
        vm.prank(reporter);
        bond.acceptOwnership();
        assertEq(bond.owner(), reporter, "accepted");
        vm.prank(reporter);
        bond.proposeRefereeSet(_addrs(1), 1);
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, owner));
        vm.prank(owner);
        bond.cancelRefereeSet();
    }

    function test_acceptOwnership_notPending_reverts() public {
        vm.prank(owner);
        bond.transferOwnership(reporter);
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, challenger));
        vm.prank(challenger);
        bond.acceptOwnership();
    }

    function test_transferOwnership_notOwner_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, reporter));
        vm.prank(reporter);
        bond.transferOwnership(reporter);
    }

    function test_renounceOwnership_byOwner_succeeds() public {
        vm.prank(owner);
        bond.transferOwnership(reporter);
        vm.prank(owner);
        bond.renounceOwnership();
        assertEq(bond.owner(), address(0), "no owner");
        assertEq(bond.pendingOwner(), address(0), "pending transfer cancelled");
        // no more proposals; disputes still resolve
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, owner));
        vm.prank(owner);
        bond.proposeRefereeSet(_addrs(1), 1);
        uint256 id = _openChallenge();
        bond.resolve(id, true, _quorum(id, true, 2));
        assertEq(_bondOf(operator), 2 ether - SLASH_AMOUNT, "quorum still works");
    }

    /// Renouncing doesn't withdraw a pending proposal: it still takes effect after its delay.
    function test_renounceOwnership_pendingSetStillActivates_succeeds() public {
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(_addrs(2), 2);
        vm.prank(owner);
        bond.renounceOwnership();
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, owner));
        vm.prank(owner);
        bond.cancelRefereeSet();
        vm.warp(eta);
        bond.activateRefereeSet();
        assertEq(bond.refereeEpoch(), 2, "activated");
    }

    function test_renounceOwnership_notOwner_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(Ownable.OwnableUnauthorizedAccount.selector, reporter));
        vm.prank(reporter);
        bond.renounceOwnership();
    }

    /*//////////////////////////////////////////////////////////////
                                PAYOUTS
    //////////////////////////////////////////////////////////////*/

    function test_withdraw_wholeCredit_succeeds() public {
        uint256 id = _openChallenge();
        bond.resolve(id, true, _quorum(id, true, 2));
        uint256 credit = CHALLENGER_BOND + REWARD;
        uint256 before = challenger.balance;
        vm.expectEmit(true, false, false, true, address(bond));
        emit SpecmarketBond.Withdrawn(challenger, credit);
        vm.prank(challenger);
        bond.withdraw();
        assertEq(challenger.balance, before + credit, "paid");
        assertEq(bond.credits(challenger), 0, "credit cleared");

        vm.prank(treasury);
        bond.withdraw();
        assertEq(treasury.balance, SLASH_AMOUNT - REWARD, "treasury paid");
        assertEq(address(bond).balance, 2 ether - SLASH_AMOUNT, "only the bond is left");
    }

    function test_withdraw_nothing_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.NothingToWithdraw.selector, reporter));
        vm.prank(reporter);
        bond.withdraw();
    }

    function test_withdraw_recipientRefusesEth_reverts() public {
        EthRefuser refuser = new EthRefuser();
        vm.deal(address(refuser), 1 ether);
        vm.prank(address(refuser));
        bond.register{value: MIN_BOND}(MODEL);
        _leave(address(refuser));
        vm.expectRevert(abi.encodeWithSelector(SpecmarketBond.WithdrawFailed.selector, address(refuser), MIN_BOND));
        refuser.callWithdraw(bond);
        assertEq(bond.credits(address(refuser)), MIN_BOND, "credit kept");
    }

    function test_withdraw_reentrancy_reverts() public {
        Reenterer re = new Reenterer(bond);
        vm.deal(address(re), 1 ether);
        vm.prank(address(re));
        bond.register{value: MIN_BOND}(MODEL);
        _leave(address(re));

        re.start();
        // the re-entrant withdraw() hit the guard; the credit was paid exactly once
        assertEq(
            keccak256(re.innerError()),
            keccak256(abi.encodeWithSelector(ReentrancyGuard.ReentrancyGuardReentrantCall.selector)),
            "inner call blocked by the guard"
        );
        assertEq(re.received(), MIN_BOND, "paid once");
        assertEq(bond.credits(address(re)), 0, "credit cleared");
        assertEq(address(bond).balance, 2 ether, "only the operator's bond is left");
    }

    function test_receive_plainTransfer_reverts() public {
        vm.prank(challenger);
        (bool ok,) = address(bond).call{value: 1 ether}("");
        assertFalse(ok, "no receive(): stray ETH is refused");
    }
}
