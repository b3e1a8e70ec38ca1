// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowFixture} from "./utils/EscrowFixture.sol";
import {TestUtils} from "./utils/TestBase.sol";
import {Anvil} from "../script/utils/DevChain.sol";
import {DrafterEscrow} from "../src/DrafterEscrow.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";

/// @dev Refuses ETH: a drafter (or an operator) that can't be paid.
contract EscrowEthRefuser {
    function callRedeem(DrafterEscrow e, DrafterEscrow.Voucher calldata v, bytes calldata sig) external {
        e.redeem(v, sig);
    }

    function callDeposit(DrafterEscrow e) external payable {
        e.deposit{value: msg.value}();
    }

    function callWithdraw(DrafterEscrow e, uint256 amount) external {
        e.withdraw(amount);
    }
}

/// @dev A drafter contract that, when paid, re-enters `redeem` with the voucher it was paid for
///      and with a newer one, and `withdraw`, and records how the inner calls failed.
contract RedeemReenterer {
    DrafterEscrow internal immutable e;
    DrafterEscrow.Voucher internal v1;
    bytes internal sig1;
    DrafterEscrow.Voucher internal v2;
    bytes internal sig2;
    bytes public innerErrorSame;
    bytes public innerErrorNewer;
    bytes public innerErrorWithdraw;
    uint256 public received;

    constructor(DrafterEscrow e_) {
        e = e_;
    }

    function arm(
        DrafterEscrow.Voucher calldata a,
        bytes calldata sa,
        DrafterEscrow.Voucher calldata b,
        bytes calldata sb
    ) external {
        (v1, sig1, v2, sig2) = (a, sa, b, sb);
    }

    function start() external returns (uint256) {
        return e.redeem(v1, sig1);
    }

    function redeemNewer() external returns (uint256) {
        return e.redeem(v2, sig2);
    }

    receive() external payable {
        received += msg.value;
        if (innerErrorSame.length != 0) return; // re-enter once
        try e.redeem(v1, sig1) {}
        catch (bytes memory err) {
            innerErrorSame = err;
        }
        try e.redeem(v2, sig2) {}
        catch (bytes memory err) {
            innerErrorNewer = err;
        }
        try e.withdraw(1) {}
        catch (bytes memory err) {
            innerErrorWithdraw = err;
        }
    }
}

/// @dev An operator contract that re-enters `withdraw` when it is paid.
contract WithdrawReenterer {
    DrafterEscrow internal immutable e;
    bytes public innerError;
    uint256 public received;

    constructor(DrafterEscrow e_) {
        e = e_;
    }

    function depositAndWithdraw(uint256 amount) external payable {
        e.deposit{value: msg.value}();
        e.withdraw(amount);
    }

    receive() external payable {
        received += msg.value;
        try e.withdraw(msg.value) {}
        catch (bytes memory err) {
            innerError = err;
        }
    }
}

/// @dev Unit tests: every external function's success path and every revert.
contract DrafterEscrowTest is EscrowFixture {
    uint256 internal constant HELD = POOLED + LANED;

    /*//////////////////////////////////////////////////////////////
                         CONSTRUCTOR, CONSTANTS
    //////////////////////////////////////////////////////////////*/

    function test_constructor_setsThawingPeriod_succeeds() public view {
        assertEq(escrow.thawingPeriod(), PERIOD, "thawingPeriod");
        assertEq(escrow.poolOf(operator), POOLED, "the fixture's pool");
        assertEq(_main().balance, LANED, "the fixture's lane");
        assertEq(address(escrow).balance, HELD, "held");
    }

    function test_constructor_minThawingPeriod_succeeds() public {
        DrafterEscrow e = new DrafterEscrow(2 hours);
        assertEq(e.thawingPeriod(), 2 hours, "thawingPeriod");
    }

    function test_constructor_belowMin_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawingPeriodTooShort.selector, 2 hours - 1, 2 hours));
        new DrafterEscrow(2 hours - 1);
    }

    function test_constructor_zero_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawingPeriodTooShort.selector, 0, 2 hours));
        new DrafterEscrow(0);
    }

    function test_constructor_aboveMax_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawingPeriodTooLong.selector, 365 days + 1, 365 days));
        new DrafterEscrow(365 days + 1);
    }

    function test_constructor_maxThawingPeriod_succeeds() public {
        DrafterEscrow e = new DrafterEscrow(365 days);
        vm.prank(operator);
        e.fundLane{value: 1 ether}(drafter, LANE, 0);
        vm.warp(type(uint32).max); // year 2106: readyAt still fits uint64 with room to spare
        vm.prank(operator);
        e.requestThaw(drafter, LANE, 1 ether);
        vm.warp(block.timestamp + 365 days);
        vm.prank(operator);
        e.thaw(drafter, LANE);
        uint256 before = operator.balance;
        vm.prank(operator);
        e.withdraw(1 ether);
        assertEq(operator.balance, before + 1 ether, "a lane can always be emptied");
    }

    function test_constants_values_succeeds() public view {
        assertEq(
            escrow.VOUCHER_TYPEHASH(),
            keccak256("Voucher(address operator,address drafter,uint64 lane,uint256 cumulativeWei,uint64 issuedAt)"),
            "VOUCHER_TYPEHASH"
        );
        assertEq(
            escrow.VOUCHER_TYPEHASH(),
            0xcd62e47f67698ce0a8e93825d7c097df5ee0a7fe54dab37077c98df6d9d21906,
            "VOUCHER_TYPEHASH, the value"
        );
        assertEq(escrow.REDEEM_WINDOW(), 1 hours, "REDEEM_WINDOW");
        assertEq(escrow.MIN_THAWING_PERIOD(), 2 * escrow.REDEEM_WINDOW(), "MIN_THAWING_PERIOD");
        assertEq(escrow.MAX_THAWING_PERIOD(), 365 days, "MAX_THAWING_PERIOD");
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
        ) = escrow.eip712Domain();
        assertEq(uint256(uint8(fields)), 0x0f, "name, version, chainId, verifyingContract");
        assertEq(keccak256(bytes(name)), keccak256("SpecmarketDrafterEscrow"), "name");
        assertEq(keccak256(bytes(version)), keccak256("2"), "version");
        assertEq(chainId, block.chainid, "chainId");
        assertEq(verifyingContract, address(escrow), "verifyingContract");
        assertEq(salt, bytes32(0), "no salt");
        assertEq(extensions.length, 0, "no extensions");
    }

    /*//////////////////////////////////////////////////////////////
                                HASHING
    //////////////////////////////////////////////////////////////*/

    // Computed with eth-account 0.14 (`encode_typed_data`, `Account.sign_message`), independently
    // of this contract: chain 31337, the escrow at anvil account 0's nonce-1 address (where
    // script/Deploy.s.sol puts it on a fresh anvil), operator key 0xb0b, drafter 0x…D4A7, lane 7,
    // cumulativeWei 1.5 ether, issuedAt 1700000000.
    address internal constant KAT_ESCROW = 0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512;
    bytes32 internal constant KAT_DOMAIN = 0xd7edf1da074cd7849c5019c3332e3c83d3ff58d38fcbd177c284d014aadf9185;
    bytes32 internal constant KAT_DIGEST = 0x47ec403db74caa7255de9a5609681a42b9022a3636ad2ba53f62dc36dd23d820;
    bytes internal constant KAT_SIG =
        hex"8e1b230bb46e463684945e4de1fdfd8c14c8aef14c907ae3d6b3f7a9c897be267957e4a346832bb2d82a814eb8b307e02421143e3f01d8d0643a7161b266fb891c";

    function test_voucherDigest_knownAnswer_succeeds() public {
        vm.chainId(31337);
        vm.setNonce(Anvil.ACCOUNT_0, 1);
        vm.prank(Anvil.ACCOUNT_0);
        DrafterEscrow e = new DrafterEscrow(2 hours);
        assertEq(address(e), KAT_ESCROW, "deterministic address");
        assertEq(e.domainSeparator(), KAT_DOMAIN, "domain separator");
        assertEq(operator, 0x0376AAc07Ad725E01357B1725B5ceC61aE10473c, "operator: key 0xb0b");
        DrafterEscrow.Voucher memory v = DrafterEscrow.Voucher(operator, drafter, 7, 1.5 ether, 1_700_000_000);
        assertEq(e.voucherDigest(v), KAT_DIGEST, "voucher digest");
        assertEq(_refVoucherDigest(e, v), KAT_DIGEST, "reference digest");
        // forge's vm.sign and eth-account both use RFC 6979 nonces: same signature byte for byte.
        assertEq(keccak256(_signVoucher(e, OPERATOR_PK, v)), keccak256(KAT_SIG), "signature");
        vm.prank(operator);
        e.fundLane{value: 2 ether}(drafter, 7, 0);
        vm.prank(drafter);
        assertEq(e.redeem(v, KAT_SIG), 1.5 ether, "the known-answer voucher redeems");
    }

    function test_voucherDigest_matchesManualEip712_succeeds() public view {
        bytes32 domain = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("SpecmarketDrafterEscrow"),
                keccak256("2"),
                block.chainid,
                address(escrow)
            )
        );
        assertEq(escrow.domainSeparator(), domain, "domain");
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 3 ether);
        bytes32 structHash = keccak256(
            abi.encode(
                keccak256(
                    "Voucher(address operator,address drafter,uint64 lane,uint256 cumulativeWei,uint64 issuedAt)"
                ),
                v.operator,
                v.drafter,
                v.lane,
                v.cumulativeWei,
                v.issuedAt
            )
        );
        assertEq(escrow.voucherDigest(v), keccak256(abi.encodePacked("\x19\x01", domain, structHash)), "digest");
        assertEq(escrow.voucherDigest(v), _refVoucherDigest(escrow, v), "digest, word by word");
    }

    function test_voucherDigest_laneIsHashed_succeeds() public view {
        DrafterEscrow.Voucher memory a = _voucher(operator, drafter, LANE, 1 ether);
        DrafterEscrow.Voucher memory b = _voucher(operator, drafter, LANE_B, 1 ether);
        assertTrue(escrow.voucherDigest(a) != escrow.voucherDigest(b), "one digest per lane");
    }

    function test_domainSeparator_followsChainId_succeeds() public {
        bytes32 before = escrow.domainSeparator();
        vm.chainId(block.chainid + 1);
        assertTrue(escrow.domainSeparator() != before, "a fork's chain id gets its own domain");
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        assertEq(escrow.voucherDigest(v), _refVoucherDigest(escrow, v), "digest on the new chain id");
    }

    /*//////////////////////////////////////////////////////////////
                                 POOLS
    //////////////////////////////////////////////////////////////*/

    function test_deposit_credits_succeeds() public {
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Deposited(other, other, 3 ether, 3 ether);
        vm.prank(other);
        escrow.deposit{value: 3 ether}();
        assertEq(escrow.poolOf(other), 3 ether, "pool");
        assertEq(escrow.poolOf(operator), POOLED, "other pools untouched");
        assertEq(address(escrow).balance, HELD + 3 ether, "held");
    }

    function test_deposit_accumulates_succeeds() public {
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Deposited(operator, operator, 1 ether, POOLED + 1 ether);
        vm.prank(operator);
        escrow.deposit{value: 1 ether}();
        assertEq(escrow.poolOf(operator), POOLED + 1 ether, "pool");
        assertEq(_main().balance, LANED, "lanes untouched");
    }

    function test_deposit_zero_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        vm.prank(operator);
        escrow.deposit();
    }

    function test_depositFor_creditsOperator_succeeds() public {
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Deposited(operator, depositor, 2 ether, POOLED + 2 ether);
        vm.prank(depositor);
        escrow.depositFor{value: 2 ether}(operator);
        assertEq(escrow.poolOf(operator), POOLED + 2 ether, "operator credited");
        assertEq(escrow.poolOf(depositor), 0, "the depositor holds nothing");
        // only the operator can take it out again
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, 2 ether, 0));
        vm.prank(depositor);
        escrow.withdraw(2 ether);
    }

    function test_depositFor_zeroAddress_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAddress.selector));
        vm.prank(depositor);
        escrow.depositFor{value: 1 ether}(address(0));
    }

    function test_depositFor_zeroAmount_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        vm.prank(depositor);
        escrow.depositFor(operator);
    }

    function test_receive_plainTransfer_reverts() public {
        vm.prank(depositor);
        (bool ok,) = address(escrow).call{value: 1 ether}("");
        assertFalse(ok, "no receive(): stray ETH is refused");
    }

    function test_withdraw_partOfPool_succeeds() public {
        uint256 before = operator.balance;
        vm.expectEmit(true, false, false, true, address(escrow));
        emit DrafterEscrow.Withdrawn(operator, 2 ether, POOLED - 2 ether);
        vm.prank(operator);
        assertEq(escrow.withdraw(2 ether), 2 ether, "returns the amount");
        assertEq(operator.balance, before + 2 ether, "sent at once, no delay");
        assertEq(escrow.poolOf(operator), POOLED - 2 ether, "pool");
        assertEq(_main().balance, LANED, "the lane is untouched");
        assertEq(address(escrow).balance, HELD - 2 ether, "held");
    }

    function test_withdraw_wholePool_succeeds() public {
        vm.prank(operator);
        assertEq(escrow.withdraw(POOLED), POOLED, "the whole pool");
        assertEq(escrow.poolOf(operator), 0, "empty");
        assertEq(address(escrow).balance, LANED, "held: the lane only");
    }

    function test_withdraw_zero_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        vm.prank(operator);
        escrow.withdraw(0);
    }

    function test_withdraw_laneNotReachable_reverts() public {
        // the lane's 10 ether are promised to the drafter: a withdrawal reaches the pool only
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, POOLED + 1, POOLED));
        vm.prank(operator);
        escrow.withdraw(POOLED + 1);
    }

    function test_withdraw_noPool_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, 1, 0));
        vm.prank(other);
        escrow.withdraw(1);
    }

    function test_withdraw_recipientRefusesEth_reverts() public {
        EscrowEthRefuser refuser = new EscrowEthRefuser();
        vm.deal(address(refuser), 1 ether);
        refuser.callDeposit{value: 1 ether}(escrow);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.TransferFailed.selector, address(refuser), 1 ether));
        refuser.callWithdraw(escrow, 1 ether);
        assertEq(escrow.poolOf(address(refuser)), 1 ether, "pool kept");
    }

    function test_withdraw_reentrancy_reverts() public {
        WithdrawReenterer re = new WithdrawReenterer(escrow);
        re.depositAndWithdraw{value: 2 ether}(1 ether);
        assertEq(
            keccak256(re.innerError()),
            keccak256(abi.encodeWithSelector(ReentrancyGuard.ReentrancyGuardReentrantCall.selector)),
            "inner call blocked by the guard"
        );
        assertEq(re.received(), 1 ether, "paid once");
        assertEq(escrow.poolOf(address(re)), 1 ether, "the rest stays");
    }

    /*//////////////////////////////////////////////////////////////
                                 LANES
    //////////////////////////////////////////////////////////////*/

    function test_fundLane_fromPool_succeeds() public {
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.LaneFunded(operator, drafter2, LANE, 3 ether, 3 ether);
        vm.prank(operator);
        escrow.fundLane(drafter2, LANE, 3 ether);
        assertEq(_laneOf(escrow, operator, drafter2, LANE).balance, 3 ether, "lane");
        assertEq(escrow.poolOf(operator), POOLED - 3 ether, "moved out of the pool");
        assertEq(address(escrow).balance, HELD, "no ETH moved");
    }

    function test_fundLane_withValue_succeeds() public {
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.LaneFunded(operator, drafter, LANE, 2 ether, LANED + 2 ether);
        vm.prank(operator);
        escrow.fundLane{value: 2 ether}(drafter, LANE, 0);
        assertEq(_main().balance, LANED + 2 ether, "lane topped up");
        assertEq(escrow.poolOf(operator), POOLED, "pool untouched");
        assertEq(address(escrow).balance, HELD + 2 ether, "held");
    }

    function test_fundLane_valueAndPool_succeeds() public {
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.LaneFunded(operator, drafter, LANE_B, 3 ether, 3 ether);
        vm.prank(operator);
        escrow.fundLane{value: 1 ether}(drafter, LANE_B, 2 ether);
        assertEq(_laneOf(escrow, operator, drafter, LANE_B).balance, 3 ether, "lane B");
        assertEq(_main().balance, LANED, "lane A untouched");
        assertEq(escrow.poolOf(operator), POOLED - 2 ether, "pool");
        assertEq(address(escrow).balance, HELD + 1 ether, "held");
    }

    function test_fundLane_wholePool_succeeds() public {
        vm.prank(operator);
        escrow.fundLane(drafter, LANE, POOLED);
        assertEq(escrow.poolOf(operator), 0, "pool empty");
        assertEq(_main().balance, HELD, "everything is in the lane");
    }

    function test_fundLane_onlyOwnLanes_succeeds() public {
        // `other` funding "drafter's lane 7" funds (other, drafter, 7), never the operator's
        vm.prank(other);
        escrow.fundLane{value: 1 ether}(drafter, LANE, 0);
        assertEq(_laneOf(escrow, other, drafter, LANE).balance, 1 ether, "other's lane");
        assertEq(_main().balance, LANED, "the operator's lane");
    }

    function test_fundLane_zeroDrafter_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAddress.selector));
        vm.prank(operator);
        escrow.fundLane{value: 1 ether}(address(0), LANE, 0);
    }

    function test_fundLane_zeroAmount_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        vm.prank(operator);
        escrow.fundLane(drafter, LANE, 0);
    }

    function test_fundLane_fromPoolAbovePool_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, POOLED + 1, POOLED));
        vm.prank(operator);
        escrow.fundLane{value: 1 ether}(drafter, LANE, POOLED + 1);
    }

    function test_fundLane_hugeFromPool_reverts() public {
        // the pool check comes before msg.value + fromPool: no overflow panic
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsPool.selector, type(uint256).max, POOLED));
        vm.prank(operator);
        escrow.fundLane{value: 1 ether}(drafter, LANE, type(uint256).max);
    }

    function test_requestThaw_setsPending_succeeds() public {
        uint64 expected = uint64(block.timestamp + PERIOD);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.ThawRequested(operator, drafter, LANE, 4 ether, expected);
        vm.prank(operator);
        escrow.requestThaw(drafter, LANE, 4 ether);
        LaneState memory s = _main();
        assertEq(s.thawing, 4 ether, "thawing");
        assertEq(s.readyAt, expected, "readyAt");
        assertEq(s.balance, LANED, "nothing leaves yet");
    }

    function test_requestThaw_wholeLane_succeeds() public {
        _requestThaw(operator, drafter, LANE, LANED);
        assertEq(_main().thawing, LANED, "thawing");
    }

    function test_requestThaw_replacesEarlier_succeeds() public {
        _requestThaw(operator, drafter, LANE, 2 ether);
        vm.warp(block.timestamp + PERIOD - 1);
        uint64 expected = uint64(block.timestamp + PERIOD);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.ThawRequested(operator, drafter, LANE, 3 ether, expected);
        vm.prank(operator);
        escrow.requestThaw(drafter, LANE, 3 ether);
        LaneState memory s = _main();
        assertEq(s.thawing, 3 ether, "replaced amount");
        assertEq(s.readyAt, expected, "the clock restarts");
        vm.warp(block.timestamp + 1); // the first request's readyAt
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawNotReady.selector, expected, uint64(block.timestamp)));
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
    }

    function test_requestThaw_onlyItsLane_succeeds() public {
        vm.prank(operator);
        escrow.fundLane(drafter, LANE_B, 1 ether);
        _requestThaw(operator, drafter, LANE, 1 ether);
        assertEq(_laneOf(escrow, operator, drafter, LANE_B).readyAt, 0, "lane B has no thaw");
    }

    function test_requestThaw_zero_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        vm.prank(operator);
        escrow.requestThaw(drafter, LANE, 0);
    }

    function test_requestThaw_aboveLane_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsLane.selector, LANED + 1, LANED));
        vm.prank(operator);
        escrow.requestThaw(drafter, LANE, LANED + 1);
    }

    function test_requestThaw_emptyLane_reverts() public {
        // the pool doesn't count: only the lane's own balance can thaw
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsLane.selector, 1, 0));
        vm.prank(operator);
        escrow.requestThaw(drafter, LANE_B, 1);
    }

    function test_requestThaw_byNonOperator_reverts() public {
        // msg.sender is the operator: anyone else names its own (empty) lane
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsLane.selector, 1 ether, 0));
        vm.prank(drafter);
        escrow.requestThaw(drafter, LANE, 1 ether);
    }

    function test_cancelThaw_clears_succeeds() public {
        _requestThaw(operator, drafter, LANE, 4 ether);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.ThawCancelled(operator, drafter, LANE, 4 ether);
        vm.prank(operator);
        escrow.cancelThaw(drafter, LANE);
        LaneState memory s = _main();
        assertEq(s.thawing + s.readyAt, 0, "cleared");
        assertEq(s.balance, LANED, "the lane keeps its balance");
        vm.warp(block.timestamp + PERIOD);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, operator, drafter, LANE));
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
    }

    function test_cancelThaw_none_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, operator, drafter, LANE));
        vm.prank(operator);
        escrow.cancelThaw(drafter, LANE);
    }

    function test_cancelThaw_byOther_reverts() public {
        _requestThaw(operator, drafter, LANE, 4 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, drafter, drafter, LANE));
        vm.prank(drafter);
        escrow.cancelThaw(drafter, LANE);
        assertEq(_main().thawing, 4 ether, "the operator's request stands");
    }

    function test_thaw_atReadyAt_succeeds() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, 4 ether);
        vm.warp(readyAt);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Thawed(operator, drafter, LANE, 4 ether);
        vm.prank(operator);
        assertEq(escrow.thaw(drafter, LANE), 4 ether, "returns the amount");
        LaneState memory s = _main();
        assertEq(s.balance, LANED - 4 ether, "the rest stays in the lane");
        assertEq(s.thawing + s.readyAt, 0, "request cleared");
        assertEq(escrow.poolOf(operator), POOLED + 4 ether, "back in the pool");
        assertEq(address(escrow).balance, HELD, "no ETH moved");
    }

    function test_thaw_afterReadyAt_succeeds() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, LANED);
        vm.warp(readyAt + 30 days);
        vm.prank(operator);
        assertEq(escrow.thaw(drafter, LANE), LANED, "the whole lane");
        assertEq(_main().balance, 0, "empty");
        assertEq(escrow.poolOf(operator), HELD, "everything in the pool");
    }

    function test_thaw_beforeReadyAt_reverts() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, 4 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawNotReady.selector, readyAt, uint64(block.timestamp)));
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
        vm.warp(readyAt - 1);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawNotReady.selector, readyAt, readyAt - 1));
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
    }

    function test_thaw_none_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, operator, drafter, LANE));
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
    }

    function test_thaw_twice_reverts() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, 4 ether);
        vm.warp(readyAt);
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, operator, drafter, LANE));
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
    }

    function test_thaw_byOther_reverts() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, 4 ether);
        vm.warp(readyAt);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingThaw.selector, other, drafter, LANE));
        vm.prank(other);
        escrow.thaw(drafter, LANE);
    }

    function test_thaw_cutByRedemptionDuringPeriod_succeeds() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, LANED);
        vm.warp(block.timestamp + 1 hours);
        _pay(drafter, LANE, 3 ether);
        vm.warp(readyAt);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Thawed(operator, drafter, LANE, LANED - 3 ether);
        vm.prank(operator);
        assertEq(escrow.thaw(drafter, LANE), LANED - 3 ether, "only what the redemption left");
        assertEq(_main().balance, 0, "lane empty");
        assertEq(drafter.balance, 3 ether, "the drafter keeps what it redeemed");
        assertEq(escrow.poolOf(operator), POOLED + LANED - 3 ether, "pool");
    }

    function test_thaw_partialRequestAfterRedemption_succeeds() public {
        // a request below the balance isn't cut by a redemption that leaves enough
        uint64 readyAt = _requestThaw(operator, drafter, LANE, 4 ether);
        _pay(drafter, LANE, 5 ether);
        vm.warp(readyAt);
        vm.prank(operator);
        assertEq(escrow.thaw(drafter, LANE), 4 ether, "the request");
        assertEq(_main().balance, 1 ether, "the rest");
    }

    function test_thaw_everythingRedeemed_movesZero_succeeds() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, LANED);
        _pay(drafter, LANE, LANED);
        vm.warp(readyAt);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Thawed(operator, drafter, LANE, 0);
        vm.prank(operator);
        assertEq(escrow.thaw(drafter, LANE), 0, "nothing left");
        LaneState memory s = _main();
        assertEq(s.thawing + s.readyAt, 0, "request cleared");
        assertEq(escrow.poolOf(operator), POOLED, "pool unchanged");
    }

    function test_thaw_otherLanesUntouched_succeeds() public {
        vm.startPrank(operator);
        escrow.fundLane(drafter, LANE_B, 2 ether);
        escrow.fundLane(drafter2, LANE, 1 ether);
        vm.stopPrank();
        uint64 readyAt = _requestThaw(operator, drafter, LANE, LANED);
        vm.warp(readyAt);
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
        assertEq(_laneOf(escrow, operator, drafter, LANE_B).balance, 2 ether, "drafter's lane B");
        assertEq(_laneOf(escrow, operator, drafter2, LANE).balance, 1 ether, "drafter2's lane 7");
    }

    function test_thaw_thenWithdraw_succeeds() public {
        // the operator's only way out of a lane: thaw into the pool, then withdraw
        uint64 readyAt = _requestThaw(operator, drafter, LANE, LANED);
        vm.warp(readyAt);
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
        uint256 before = operator.balance;
        vm.prank(operator);
        escrow.withdraw(HELD);
        assertEq(operator.balance, before + HELD, "everything out");
        assertEq(address(escrow).balance, 0, "held");
    }

    /*//////////////////////////////////////////////////////////////
                                 REDEEM
    //////////////////////////////////////////////////////////////*/

    function test_redeem_firstVoucher_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, LANE, 1 ether, 1 ether);
        assertEq(_redeem(v, sig), 1 ether, "returns what it paid");
        assertEq(drafter.balance, 1 ether, "drafter paid");
        LaneState memory s = _main();
        assertEq(s.paid, 1 ether, "paid");
        assertEq(s.owed, 0, "nothing owed");
        assertEq(s.balance, LANED - 1 ether, "lane reduced");
        assertEq(escrow.poolOf(operator), POOLED, "pool untouched");
        assertEq(address(escrow).balance, HELD - 1 ether, "held");
    }

    function test_redeem_laterVoucher_paysIncrement_succeeds() public {
        _pay(drafter, LANE, 1 ether);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 2.5 ether);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, LANE, 2.5 ether, 1.5 ether);
        assertEq(_redeem(v, sig), 1.5 ether, "the increment");
        assertEq(drafter.balance, 2.5 ether, "drafter paid the cumulative total");
        assertEq(_main().paid, 2.5 ether, "paid");
        assertEq(_main().balance, LANED - 2.5 ether, "lane");
    }

    function test_redeem_skippedVouchers_succeeds() public {
        // only the newest voucher matters: the ones in between never need redeeming
        _signed(drafter, LANE, 1 ether);
        _signed(drafter, LANE, 2 ether);
        assertEq(_pay(drafter, LANE, 3 ether), 3 ether, "newest pays everything");
    }

    function test_redeem_sameVoucherTwice_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        _redeem(v, sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 1 ether, 1 ether));
        _redeem(v, sig);
    }

    function test_redeem_olderVoucher_reverts() public {
        (DrafterEscrow.Voucher memory old, bytes memory oldSig) = _signed(drafter, LANE, 1 ether);
        _pay(drafter, LANE, 2 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 1 ether, 2 ether));
        _redeem(old, oldSig);
        assertEq(_main().balance, LANED - 2 ether, "nothing more paid");
    }

    function test_redeem_zeroVoucher_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 0);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 0, 0));
        _redeem(v, sig);
    }

    function test_redeem_signedByOther_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        bytes memory forged = _signVoucher(escrow, OTHER_PK, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, other, operator));
        _redeem(v, forged);
    }

    function test_redeem_callerNotDrafter_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NotVoucherDrafter.selector, drafter2, drafter));
        vm.prank(drafter2);
        escrow.redeem(v, sig);
        // not even the operator that signed it
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NotVoucherDrafter.selector, operator, drafter));
        vm.prank(operator);
        escrow.redeem(v, sig);
    }

    function test_redeem_drafterSwapped_reverts() public {
        // drafter2 rewrites drafter's voucher to name itself: the signature no longer matches
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        v.drafter = drafter2;
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function test_redeem_amountRaised_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        v.cumulativeWei = 2 ether;
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function test_redeem_laneChanged_reverts() public {
        // a voucher signed for lane 8 (empty) moved onto lane 7 (funded): the signature no longer matches
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE_B, 1 ether);
        v.lane = LANE;
        address recovered = _recover(escrow.voucherDigest(v), sig);
        assertTrue(recovered != operator, "another digest");
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
        assertEq(_main().balance, LANED, "lane 7 untouched");
    }

    function test_redeem_issuedAtChanged_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        v.issuedAt += 1;
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function test_redeem_otherChainId_reverts() public {
        uint256 chain = block.chainid;
        vm.chainId(chain + 1);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        vm.chainId(chain);
        address recovered = _recover(escrow.voucherDigest(v), sig);
        assertTrue(recovered != operator, "another domain");
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function test_redeem_otherEscrowDeployment_reverts() public {
        // the same typed data, signed for a second deployment (another verifyingContract)
        DrafterEscrow twin = new DrafterEscrow(PERIOD);
        vm.prank(operator);
        twin.fundLane{value: 1 ether}(drafter, LANE, 0);
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        bytes memory twinSig = _signVoucher(twin, OPERATOR_PK, v);
        address recovered = _recover(escrow.voucherDigest(v), twinSig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, twinSig);
        // and the other way round
        bytes memory sig = _signVoucher(escrow, OPERATOR_PK, v);
        recovered = _recover(twin.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        vm.prank(drafter);
        twin.redeem(v, sig);
        // each signature is good where it was signed for
        vm.prank(drafter);
        assertEq(twin.redeem(v, twinSig), 1 ether, "redeems at its own escrow");
    }

    function test_redeem_v1Voucher_reverts() public {
        // a v1 voucher (version "1", no lane in the type) for the same escrow address never
        // verifies under v2
        bytes32 domainV1 = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("SpecmarketDrafterEscrow"),
                keccak256("1"),
                block.chainid,
                address(escrow)
            )
        );
        bytes32 structV1 = keccak256(
            abi.encode(
                keccak256("Voucher(address operator,address drafter,uint256 cumulativeWei,uint64 issuedAt)"),
                operator,
                drafter,
                1 ether,
                uint64(block.timestamp)
            )
        );
        bytes memory sigV1 = TestUtils.sign(OPERATOR_PK, keccak256(abi.encodePacked("\x19\x01", domainV1, structV1)));
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        address recovered = _recover(escrow.voucherDigest(v), sigV1);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sigV1);
    }

    function test_redeem_otherOperator_reverts() public {
        // `other` holds a lane for drafter too; the operator can't spend it, and a voucher moved
        // onto it fails
        vm.prank(other);
        escrow.fundLane{value: 5 ether}(drafter, LANE, 0);
        DrafterEscrow.Voucher memory v = _voucher(other, drafter, LANE, 1 ether);
        bytes memory sig = _signVoucher(escrow, OPERATOR_PK, v); // the operator signs for other's lane
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, operator, other));
        _redeem(v, sig);

        (DrafterEscrow.Voucher memory mine, bytes memory mineSig) = _signed(drafter, LANE, 1 ether);
        mine.operator = other; // the operator's own voucher, pointed at other's lane
        address recovered = _recover(escrow.voucherDigest(mine), mineSig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, other));
        _redeem(mine, mineSig);
        assertEq(_laneOf(escrow, other, drafter, LANE).balance, 5 ether, "other's lane untouched");
    }

    function test_redeem_zeroOperator_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(address(0), drafter, LANE, 1 ether);
        bytes memory sig = _signVoucher(escrow, OPERATOR_PK, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, operator, address(0)));
        _redeem(v, sig);
    }

    function test_redeem_highS_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 1 ether);
        bytes memory bad = _highS(sig);
        // ecrecover itself accepts the malleable twin; the contract must not.
        assertEq(_recover(escrow.voucherDigest(v), bad), operator, "ecrecover accepts high-s");
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        _redeem(v, bad);
    }

    function test_redeem_shortSignature_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 64));
        _redeem(v, new bytes(64));
    }

    function test_redeem_unrecoverableSignature_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        // r = s = 0: ecrecover yields address(0), which ECDSA refuses
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignature.selector));
        _redeem(v, abi.encodePacked(bytes32(0), bytes32(0), uint8(27)));
    }

    function test_redeem_partialPayment_emitsOwed_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 15 ether);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, LANE, 15 ether, LANED);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Owed(operator, drafter, LANE, 5 ether);
        assertEq(_redeem(v, sig), LANED, "pays what the lane holds");
        assertEq(drafter.balance, LANED, "drafter paid the whole lane");
        LaneState memory s = _main();
        assertEq(s.paid, LANED, "paid");
        assertEq(s.owed, 5 ether, "the rest is owed");
        assertEq(s.balance, 0, "lane empty");
        assertEq(escrow.poolOf(operator), POOLED, "the pool is not promised: never paid from");
    }

    function test_redeem_partialPayment_topUpPaysRest_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 15 ether);
        _redeem(v, sig);
        // a top-up smaller than the shortfall: the same voucher pays part again
        vm.prank(operator);
        escrow.fundLane(drafter, LANE, 3 ether);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Owed(operator, drafter, LANE, 2 ether);
        assertEq(_redeem(v, sig), 3 ether, "the top-up");
        assertEq(_main().owed, 2 ether, "still owed");
        // enough: the same voucher pays the rest
        vm.prank(operator);
        escrow.fundLane{value: 4 ether}(drafter, LANE, 0);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, LANE, 15 ether, 2 ether);
        assertEq(_redeem(v, sig), 2 ether, "the rest");
        assertEq(drafter.balance, 15 ether, "paid in full in the end");
        assertEq(_main().owed, 0, "nothing owed");
        assertEq(_main().balance, 2 ether, "the surplus stays in the lane");
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 15 ether, 15 ether));
        _redeem(v, sig);
    }

    function test_redeem_emptyLane_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(other, drafter, LANE, 1 ether);
        bytes memory sig = _signVoucher(escrow, OTHER_PK, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.LaneEmpty.selector, other, drafter, LANE, 1 ether));
        _redeem(v, sig);
    }

    function test_redeem_poolNotReachable_reverts() public {
        // the operator's pool holds 5 ether and the drafter's lane 7 holds 10, but lane 8 is empty
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE_B, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.LaneEmpty.selector, operator, drafter, LANE_B, 1 ether));
        _redeem(v, sig);
    }

    function test_redeem_drainedLaneWithShortfall_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 12 ether);
        _redeem(v, sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.LaneEmpty.selector, operator, drafter, LANE, 2 ether));
        _redeem(v, sig);
        assertEq(_main().owed, 2 ether, "still owed");
    }

    function test_redeem_drafterRefusesEth_reverts() public {
        EscrowEthRefuser refuser = new EscrowEthRefuser();
        vm.prank(operator);
        escrow.fundLane(address(refuser), LANE, 1 ether);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(address(refuser), LANE, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.TransferFailed.selector, address(refuser), 1 ether));
        refuser.callRedeem(escrow, v, sig);
        LaneState memory s = _laneOf(escrow, operator, address(refuser), LANE);
        assertEq(s.paid, 0, "rolled back");
        assertEq(s.balance, 1 ether, "lane kept");
    }

    function test_redeem_reentrantDrafter_getsNothingExtra_succeeds() public {
        RedeemReenterer re = new RedeemReenterer(escrow);
        vm.prank(operator);
        escrow.fundLane(address(re), LANE, 4 ether);
        (DrafterEscrow.Voucher memory v1, bytes memory s1) = _signed(address(re), LANE, 1 ether);
        (DrafterEscrow.Voucher memory v2, bytes memory s2) = _signed(address(re), LANE, 3 ether);
        re.arm(v1, s1, v2, s2);

        assertEq(re.start(), 1 ether, "outer call paid its increment");
        bytes memory guardErr = abi.encodeWithSelector(ReentrancyGuard.ReentrancyGuardReentrantCall.selector);
        assertEq(keccak256(re.innerErrorSame()), keccak256(guardErr), "re-entry with the same voucher blocked");
        assertEq(keccak256(re.innerErrorNewer()), keccak256(guardErr), "re-entry with a newer voucher blocked");
        assertEq(keccak256(re.innerErrorWithdraw()), keccak256(guardErr), "re-entry into withdraw blocked");
        assertEq(re.received(), 1 ether, "paid once");
        assertEq(_laneOf(escrow, operator, address(re), LANE).paid, 1 ether, "paid");
        // the newer voucher still pays its own increment, once, when redeemed normally
        assertEq(re.redeemNewer(), 2 ether, "newer voucher's increment");
        assertEq(re.received(), 3 ether, "3 ether in all: exactly the newest voucher");
        assertEq(_laneOf(escrow, operator, address(re), LANE).balance, 1 ether, "lane");
        assertEq(address(escrow).balance, HELD - 3 ether, "held");
    }

    function test_redeem_issuedAtNotChecked_succeeds() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        v.issuedAt = 0; // long ago
        _redeem(v, _signVoucher(escrow, OPERATOR_PK, v));
        v.cumulativeWei = 2 ether;
        v.issuedAt = type(uint64).max; // far future
        assertEq(_redeem(v, _signVoucher(escrow, OPERATOR_PK, v)), 1 ether, "informational only");
    }

    function test_redeem_duringPendingThaw_succeeds() public {
        _requestThaw(operator, drafter, LANE, LANED);
        vm.warp(block.timestamp + PERIOD - 1);
        assertEq(_pay(drafter, LANE, 4 ether), 4 ether, "the lane stays redeemable");
        assertEq(_main().thawing, LANED, "the request itself is unchanged");
    }

    function test_redeem_afterReadyAtBeforeThaw_succeeds() public {
        uint64 readyAt = _requestThaw(operator, drafter, LANE, LANED);
        vm.warp(readyAt + 1 days);
        assertEq(_pay(drafter, LANE, 4 ether), 4 ether, "redeemable until the thaw actually happens");
    }

    /// The attack v1 allowed: the operator signs a huge voucher to itself and redeems it at once.
    /// In v2 it pays only from a lane (operator, operator, id), which the drafter's lane is not.
    function test_redeem_operatorSelfVoucher_leavesLanesUntouched_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 4 ether);
        uint64[3] memory ids = [LANE, LANE_B, type(uint64).max];
        for (uint256 i; i < ids.length; ++i) {
            DrafterEscrow.Voucher memory self = _voucher(operator, operator, ids[i], 1_000 ether);
            bytes memory selfSig = _signVoucher(escrow, OPERATOR_PK, self);
            vm.expectRevert(
                abi.encodeWithSelector(DrafterEscrow.LaneEmpty.selector, operator, operator, ids[i], 1_000 ether)
            );
            vm.prank(operator);
            escrow.redeem(self, selfSig);
        }
        // a lane the operator funds for itself pays only itself, and only what it put there
        vm.prank(operator);
        escrow.fundLane(operator, LANE, 1 ether);
        DrafterEscrow.Voucher memory own = _voucher(operator, operator, LANE, 1_000 ether);
        bytes memory ownSig = _signVoucher(escrow, OPERATOR_PK, own);
        vm.prank(operator);
        assertEq(escrow.redeem(own, ownSig), 1 ether, "its own lane's balance, nothing more");
        // the drafter's own voucher, redeemed by the operator: refused
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NotVoucherDrafter.selector, operator, drafter));
        vm.prank(operator);
        escrow.redeem(v, sig);

        LaneState memory s = _main();
        assertEq(s.balance, LANED, "the drafter's lane balance is unchanged");
        assertEq(s.paid, 0, "and its paid");
        assertEq(_redeem(v, sig), 4 ether, "the drafter's own voucher still pays in full");
    }

    /// Another drafter's vouchers, however large, pay only from that drafter's lanes.
    function test_redeem_otherDraftersVoucher_leavesLaneUntouched_succeeds() public {
        vm.prank(operator);
        escrow.fundLane(drafter2, LANE, 1 ether);
        (DrafterEscrow.Voucher memory big, bytes memory bigSig) = _signed(drafter2, LANE, 50 ether);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Owed(operator, drafter2, LANE, 49 ether);
        assertEq(_redeem(big, bigSig), 1 ether, "drafter2's own lane only");
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.LaneEmpty.selector, operator, drafter2, LANE, 49 ether));
        _redeem(big, bigSig);
        assertEq(_main().balance, LANED, "drafter's lane untouched");
        assertEq(_pay(drafter, LANE, LANED), LANED, "drafter is paid its whole lane");
    }

    /// Two lanes of one operator for one drafter: their cumulative counts and balances are separate.
    function test_redeem_twoLanesIndependent_succeeds() public {
        vm.prank(operator);
        escrow.fundLane(drafter, LANE_B, 3 ether);
        assertEq(_pay(drafter, LANE_B, 2 ether), 2 ether, "lane B pays its voucher");
        // lane A's count starts at 0: a 1-ether voucher there is newer although lane B paid 2
        assertEq(_pay(drafter, LANE, 1 ether), 1 ether, "lane A counts on its own");
        // a lane-A voucher beyond lane A's balance pays lane A's rest, never from lane B
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 12 ether);
        vm.expectEmit(true, true, true, true, address(escrow));
        emit DrafterEscrow.Owed(operator, drafter, LANE, 2 ether);
        assertEq(_redeem(v, sig), LANED - 1 ether, "lane A's rest");
        LaneState memory a = _main();
        LaneState memory b = _laneOf(escrow, operator, drafter, LANE_B);
        assertEq(a.balance, 0, "lane A empty");
        assertEq(a.paid, LANED, "lane A paid");
        assertEq(a.owed, 2 ether, "lane A owed");
        assertEq(b.balance, 1 ether, "lane B untouched by lane A's voucher");
        assertEq(b.paid, 2 ether, "lane B paid");
        assertEq(b.owed, 0, "lane B owes nothing");
        // and lane B's older voucher is stale on lane B only
        (DrafterEscrow.Voucher memory oldB, bytes memory oldBSig) = _signed(drafter, LANE_B, 2 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 2 ether, 2 ether));
        _redeem(oldB, oldBSig);
    }

    /*//////////////////////////////////////////////////////////////
                        THE LANE GUARANTEE
    //////////////////////////////////////////////////////////////*/

    /// The drafter checked `balance - thawing >= unredeemed + one job's pay` (10 >= 4 + 1) and took
    /// a job; the operator asks to thaw the whole lane. The drafter redeems within REDEEM_WINDOW of
    /// `ThawRequested` and is paid in full, its job included; the thaw takes only the rest.
    function test_guarantee_redeemWithinWindowAfterThawRequest_paidInFull_succeeds() public {
        _pay(drafter, LANE, 2 ether); // earlier jobs, redeemed
        _signed(drafter, LANE, 6 ether); // 4 ether unredeemed
        LaneState memory s = _main();
        assertGe(s.balance - s.thawing, (6 ether - s.paid) + 1 ether, "the drafter's check before its job");
        uint64 readyAt = _requestThaw(operator, drafter, LANE, s.balance);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 7 ether); // the job
        vm.warp(block.timestamp + escrow.REDEEM_WINDOW());
        assertEq(_redeem(v, sig), 5 ether, "paid in full, the job included");
        vm.warp(readyAt);
        vm.prank(operator);
        assertEq(escrow.thaw(drafter, LANE), LANED - 7 ether, "the thaw gets only the rest");
        assertEq(drafter.balance, 7 ether, "every voucher paid");
    }

    /// The operator never signs for the job in flight: the drafter loses that job's pay and nothing
    /// else, however the operator thaws.
    function test_guarantee_unsignedJobIsTheMostLost_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, LANE, 4 ether);
        uint64 readyAt = _requestThaw(operator, drafter, LANE, LANED);
        vm.warp(block.timestamp + escrow.REDEEM_WINDOW() / 2);
        readyAt = _requestThaw(operator, drafter, LANE, LANED); // a re-request only restarts the clock
        vm.warp(block.timestamp + escrow.REDEEM_WINDOW());
        assertEq(_redeem(v, sig), 4 ether, "every signed voucher paid");
        vm.warp(readyAt);
        vm.prank(operator);
        escrow.thaw(drafter, LANE);
        assertEq(drafter.balance, 4 ether, "all but the unsigned job");
    }

    /// The same at the shortest thawing period the constructor allows.
    function test_guarantee_minPeriodLeavesRedeemWindow_succeeds() public {
        DrafterEscrow e = new DrafterEscrow(2 hours);
        vm.prank(operator);
        e.fundLane{value: 1 ether}(drafter, LANE, 0);
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, LANE, 1 ether);
        bytes memory sig = _signVoucher(e, OPERATOR_PK, v);
        vm.prank(operator);
        e.requestThaw(drafter, LANE, 1 ether);
        uint64 readyAt = uint64(block.timestamp + 2 hours);
        vm.warp(block.timestamp + e.REDEEM_WINDOW());
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ThawNotReady.selector, readyAt, readyAt - 1 hours));
        vm.prank(operator);
        e.thaw(drafter, LANE);
        vm.prank(drafter);
        assertEq(e.redeem(v, sig), 1 ether, "paid in full");
    }

    /*//////////////////////////////////////////////////////////////
                                 VIEWS
    //////////////////////////////////////////////////////////////*/

    function test_views_unknownAccounts_succeeds() public view {
        assertEq(escrow.poolOf(depositor), 0, "poolOf");
        LaneState memory s = _laneOf(escrow, operator, depositor, LANE);
        assertEq(s.balance + s.paid + s.owed + s.thawing + s.readyAt, 0, "lane");
        s = _laneOf(escrow, drafter, operator, LANE); // the roles swapped
        assertEq(s.balance + s.paid + s.owed + s.thawing + s.readyAt, 0, "lane, roles swapped");
    }
}
