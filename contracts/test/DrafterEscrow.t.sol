// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {EscrowFixture} from "./utils/EscrowFixture.sol";
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

    function callRequestWithdrawal(DrafterEscrow e, uint256 amount) external {
        e.requestWithdrawal(amount);
    }

    function callWithdraw(DrafterEscrow e) external {
        e.withdraw();
    }
}

/// @dev A drafter contract that, when paid, re-enters `redeem` with the voucher it was paid for
///      and with a newer one, and records how the inner calls failed.
contract RedeemReenterer {
    DrafterEscrow internal immutable e;
    DrafterEscrow.Voucher internal v1;
    bytes internal sig1;
    DrafterEscrow.Voucher internal v2;
    bytes internal sig2;
    bytes public innerErrorSame;
    bytes public innerErrorNewer;
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

    function depositAndRequest(uint256 amount) external payable {
        e.deposit{value: msg.value}();
        e.requestWithdrawal(amount);
    }

    function start() external {
        e.withdraw();
    }

    receive() external payable {
        received += msg.value;
        try e.withdraw() {}
        catch (bytes memory err) {
            innerError = err;
        }
    }
}

/// @dev Unit tests: every external function's success path and every revert.
contract DrafterEscrowTest is EscrowFixture {
    /*//////////////////////////////////////////////////////////////
                         CONSTRUCTOR, CONSTANTS
    //////////////////////////////////////////////////////////////*/

    function test_constructor_setsDelay_succeeds() public view {
        assertEq(escrow.withdrawalDelay(), DELAY, "withdrawalDelay");
        assertEq(escrow.balanceOf(operator), ESCROWED, "the fixture's deposit");
        assertEq(address(escrow).balance, ESCROWED, "held");
    }

    function test_constructor_minDelay_succeeds() public {
        DrafterEscrow e = new DrafterEscrow(2 hours);
        assertEq(e.withdrawalDelay(), 2 hours, "withdrawalDelay");
    }

    function test_constructor_delayBelowMin_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.DelayTooShort.selector, 2 hours - 1, 2 hours));
        new DrafterEscrow(2 hours - 1);
    }

    function test_constructor_zeroDelay_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.DelayTooShort.selector, 0, 2 hours));
        new DrafterEscrow(0);
    }

    function test_constructor_delayAboveMax_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.DelayTooLong.selector, 365 days + 1, 365 days));
        new DrafterEscrow(365 days + 1);
    }

    function test_constructor_maxDelay_succeeds() public {
        DrafterEscrow e = new DrafterEscrow(365 days);
        vm.prank(operator);
        e.deposit{value: 1 ether}();
        vm.warp(type(uint32).max); // year 2106: readyAt still fits uint64 with room to spare
        vm.prank(operator);
        e.requestWithdrawal(1 ether);
        vm.warp(block.timestamp + 365 days);
        uint256 before = operator.balance;
        vm.prank(operator);
        e.withdraw();
        assertEq(operator.balance, before + 1 ether, "an escrow can always leave");
    }

    function test_constants_values_succeeds() public view {
        assertEq(
            escrow.VOUCHER_TYPEHASH(),
            keccak256("Voucher(address operator,address drafter,uint256 cumulativeWei,uint64 issuedAt)"),
            "VOUCHER_TYPEHASH"
        );
        assertEq(escrow.REDEEM_WINDOW(), 1 hours, "REDEEM_WINDOW");
        assertEq(escrow.MIN_WITHDRAWAL_DELAY(), 2 * escrow.REDEEM_WINDOW(), "MIN_WITHDRAWAL_DELAY");
        assertEq(escrow.MAX_WITHDRAWAL_DELAY(), 365 days, "MAX_WITHDRAWAL_DELAY");
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
        assertEq(keccak256(bytes(version)), keccak256("1"), "version");
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
    // script/Deploy.s.sol puts it on a fresh anvil), operator key 0xb0b, drafter 0x…D4A7,
    // cumulativeWei 1.5 ether, issuedAt 1700000000.
    address internal constant KAT_ESCROW = 0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512;
    bytes32 internal constant KAT_DOMAIN = 0x2b412135d768ef982823a852f73c269a122356a692df3d79533493592f671f14;
    bytes32 internal constant KAT_DIGEST = 0xd4b67e6dc00d0819bfa9443ed7700c868da77504fd3008faf8c271186b8b0458;
    bytes internal constant KAT_SIG =
        hex"f44c7a0753f7b83b024f33a2d42ce7652f78f281a0973e86b9108782da0be2fc4a980580bba70b4667610c0596bb3c82c1b92fcaff1b99303cd1b5fbdd18cf3e1b";

    function test_voucherDigest_knownAnswer_succeeds() public {
        vm.chainId(31337);
        vm.setNonce(Anvil.ACCOUNT_0, 1);
        vm.prank(Anvil.ACCOUNT_0);
        DrafterEscrow e = new DrafterEscrow(2 hours);
        assertEq(address(e), KAT_ESCROW, "deterministic address");
        assertEq(e.domainSeparator(), KAT_DOMAIN, "domain separator");
        DrafterEscrow.Voucher memory v = DrafterEscrow.Voucher(operator, drafter, 1.5 ether, 1_700_000_000);
        assertEq(e.voucherDigest(v), KAT_DIGEST, "voucher digest");
        // forge's vm.sign and eth-account both use RFC 6979 nonces: same signature byte for byte.
        assertEq(keccak256(_signVoucher(e, OPERATOR_PK, v)), keccak256(KAT_SIG), "signature");
        vm.prank(operator);
        e.deposit{value: 2 ether}();
        vm.prank(drafter);
        assertEq(e.redeem(v, KAT_SIG), 1.5 ether, "the known-answer voucher redeems");
    }

    function test_voucherDigest_matchesManualEip712_succeeds() public view {
        bytes32 domain = keccak256(
            abi.encode(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("SpecmarketDrafterEscrow"),
                keccak256("1"),
                block.chainid,
                address(escrow)
            )
        );
        assertEq(escrow.domainSeparator(), domain, "domain");
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 3 ether);
        bytes32 structHash = keccak256(
            abi.encode(
                keccak256("Voucher(address operator,address drafter,uint256 cumulativeWei,uint64 issuedAt)"),
                v.operator,
                v.drafter,
                v.cumulativeWei,
                v.issuedAt
            )
        );
        assertEq(escrow.voucherDigest(v), keccak256(abi.encodePacked("\x19\x01", domain, structHash)), "digest");
        assertEq(escrow.voucherDigest(v), _refVoucherDigest(escrow, v), "digest, word by word");
    }

    function test_domainSeparator_followsChainId_succeeds() public {
        bytes32 before = escrow.domainSeparator();
        vm.chainId(block.chainid + 1);
        assertTrue(escrow.domainSeparator() != before, "a fork's chain id gets its own domain");
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
        assertEq(escrow.voucherDigest(v), _refVoucherDigest(escrow, v), "digest on the new chain id");
    }

    /*//////////////////////////////////////////////////////////////
                                DEPOSITS
    //////////////////////////////////////////////////////////////*/

    function test_deposit_credits_succeeds() public {
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Deposited(other, other, 3 ether, 3 ether);
        vm.prank(other);
        escrow.deposit{value: 3 ether}();
        assertEq(escrow.balanceOf(other), 3 ether, "balance");
        assertEq(escrow.balanceOf(operator), ESCROWED, "other escrows untouched");
        assertEq(address(escrow).balance, ESCROWED + 3 ether, "held");
    }

    function test_deposit_accumulates_succeeds() public {
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Deposited(operator, operator, 1 ether, ESCROWED + 1 ether);
        vm.prank(operator);
        escrow.deposit{value: 1 ether}();
        assertEq(escrow.balanceOf(operator), ESCROWED + 1 ether, "balance");
    }

    function test_deposit_zero_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        vm.prank(operator);
        escrow.deposit();
    }

    function test_depositFor_creditsOperator_succeeds() public {
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Deposited(operator, depositor, 2 ether, ESCROWED + 2 ether);
        vm.prank(depositor);
        escrow.depositFor{value: 2 ether}(operator);
        assertEq(escrow.balanceOf(operator), ESCROWED + 2 ether, "operator credited");
        assertEq(escrow.balanceOf(depositor), 0, "the depositor holds nothing");
        // only the operator can take it out again
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsBalance.selector, 2 ether, 0));
        vm.prank(depositor);
        escrow.requestWithdrawal(2 ether);
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

    /*//////////////////////////////////////////////////////////////
                                 REDEEM
    //////////////////////////////////////////////////////////////*/

    function test_redeem_firstVoucher_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, 1 ether, 1 ether);
        assertEq(_redeem(v, sig), 1 ether, "returns what it paid");
        assertEq(drafter.balance, 1 ether, "drafter paid");
        assertEq(escrow.paid(operator, drafter), 1 ether, "paid");
        assertEq(escrow.owed(operator, drafter), 0, "nothing owed");
        assertEq(escrow.balanceOf(operator), ESCROWED - 1 ether, "escrow reduced");
        assertEq(address(escrow).balance, ESCROWED - 1 ether, "held");
    }

    function test_redeem_laterVoucher_paysIncrement_succeeds() public {
        _pay(drafter, 1 ether);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 2.5 ether);
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, 2.5 ether, 1.5 ether);
        assertEq(_redeem(v, sig), 1.5 ether, "the increment");
        assertEq(drafter.balance, 2.5 ether, "drafter paid the cumulative total");
        assertEq(escrow.paid(operator, drafter), 2.5 ether, "paid");
        assertEq(escrow.balanceOf(operator), ESCROWED - 2.5 ether, "escrow");
    }

    function test_redeem_skippedVouchers_succeeds() public {
        // only the newest voucher matters: the ones in between never need redeeming
        _signed(drafter, 1 ether);
        _signed(drafter, 2 ether);
        assertEq(_pay(drafter, 3 ether), 3 ether, "newest pays everything");
    }

    function test_redeem_twoDraftersIndependent_succeeds() public {
        _pay(drafter, 2 ether);
        assertEq(_pay(drafter2, 1 ether), 1 ether, "a second drafter's first voucher pays in full");
        assertEq(escrow.paid(operator, drafter), 2 ether, "drafter");
        assertEq(escrow.paid(operator, drafter2), 1 ether, "drafter2");
        assertEq(escrow.balanceOf(operator), ESCROWED - 3 ether, "escrow");
    }

    function test_redeem_sameVoucherTwice_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        _redeem(v, sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 1 ether, 1 ether));
        _redeem(v, sig);
    }

    function test_redeem_olderVoucher_reverts() public {
        (DrafterEscrow.Voucher memory old, bytes memory oldSig) = _signed(drafter, 1 ether);
        _pay(drafter, 2 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 1 ether, 2 ether));
        _redeem(old, oldSig);
        assertEq(escrow.balanceOf(operator), ESCROWED - 2 ether, "nothing more paid");
    }

    function test_redeem_zeroVoucher_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 0);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 0, 0));
        _redeem(v, sig);
    }

    function test_redeem_signedByOther_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
        bytes memory forged = _signVoucher(escrow, OTHER_PK, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, other, operator));
        _redeem(v, forged);
    }

    function test_redeem_callerNotDrafter_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
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
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        v.drafter = drafter2;
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function test_redeem_amountRaised_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        v.cumulativeWei = 2 ether;
        address recovered = _recover(escrow.voucherDigest(v), sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function test_redeem_otherChainId_reverts() public {
        uint256 chain = block.chainid;
        vm.chainId(chain + 1);
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        vm.chainId(chain);
        address recovered = _recover(escrow.voucherDigest(v), sig);
        assertTrue(recovered != operator, "another domain");
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, operator));
        _redeem(v, sig);
    }

    function test_redeem_otherEscrowDeployment_reverts() public {
        // the same typed data, signed for a second deployment (another verifyingContract)
        DrafterEscrow twin = new DrafterEscrow(DELAY);
        vm.prank(operator);
        twin.deposit{value: 1 ether}();
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
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

    function test_redeem_otherOperator_reverts() public {
        // `other` holds an escrow too; the operator can't spend it, and a voucher moved onto it fails
        vm.prank(other);
        escrow.deposit{value: 5 ether}();
        DrafterEscrow.Voucher memory v = _voucher(other, drafter, 1 ether);
        bytes memory sig = _signVoucher(escrow, OPERATOR_PK, v); // the operator signs for other's escrow
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, operator, other));
        _redeem(v, sig);

        (DrafterEscrow.Voucher memory mine, bytes memory mineSig) = _signed(drafter, 1 ether);
        mine.operator = other; // the operator's own voucher, pointed at other's escrow
        address recovered = _recover(escrow.voucherDigest(mine), mineSig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, recovered, other));
        _redeem(mine, mineSig);
        assertEq(escrow.balanceOf(other), 5 ether, "other's escrow untouched");
    }

    function test_redeem_zeroOperator_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(address(0), drafter, 1 ether);
        bytes memory sig = _signVoucher(escrow, OPERATOR_PK, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.BadSigner.selector, operator, address(0)));
        _redeem(v, sig);
    }

    function test_redeem_highS_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 1 ether);
        bytes memory bad = _highS(sig);
        // ecrecover itself accepts the malleable twin; the contract must not.
        assertEq(_recover(escrow.voucherDigest(v), bad), operator, "ecrecover accepts high-s");
        (,, bytes32 s) = _split(bad);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, s));
        _redeem(v, bad);
    }

    function test_redeem_shortSignature_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureLength.selector, 64));
        _redeem(v, new bytes(64));
    }

    function test_redeem_unrecoverableSignature_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
        // r = s = 0: ecrecover yields address(0), which ECDSA refuses
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignature.selector));
        _redeem(v, abi.encodePacked(bytes32(0), bytes32(0), uint8(27)));
    }

    function test_redeem_partialPayment_emitsOwed_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 15 ether);
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, 15 ether, ESCROWED);
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Owed(operator, drafter, 5 ether);
        assertEq(_redeem(v, sig), ESCROWED, "pays what is there");
        assertEq(drafter.balance, ESCROWED, "drafter paid the whole escrow");
        assertEq(escrow.paid(operator, drafter), ESCROWED, "paid");
        assertEq(escrow.owed(operator, drafter), 5 ether, "the rest is owed");
        assertEq(escrow.balanceOf(operator), 0, "escrow empty");
    }

    function test_redeem_partialPayment_topUpPaysRest_succeeds() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 15 ether);
        _redeem(v, sig);
        // a top-up smaller than the shortfall: the same voucher pays part again
        vm.prank(depositor);
        escrow.depositFor{value: 3 ether}(operator);
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Owed(operator, drafter, 2 ether);
        assertEq(_redeem(v, sig), 3 ether, "the top-up");
        assertEq(escrow.owed(operator, drafter), 2 ether, "still owed");
        // enough: the same voucher pays the rest
        vm.prank(operator);
        escrow.deposit{value: 4 ether}();
        vm.expectEmit(true, true, false, true, address(escrow));
        emit DrafterEscrow.Redeemed(operator, drafter, 15 ether, 2 ether);
        assertEq(_redeem(v, sig), 2 ether, "the rest");
        assertEq(drafter.balance, 15 ether, "paid in full in the end");
        assertEq(escrow.owed(operator, drafter), 0, "nothing owed");
        assertEq(escrow.balanceOf(operator), 2 ether, "the surplus stays");
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.VoucherNotNewer.selector, 15 ether, 15 ether));
        _redeem(v, sig);
    }

    function test_redeem_emptyEscrow_reverts() public {
        DrafterEscrow.Voucher memory v = _voucher(other, drafter, 1 ether);
        bytes memory sig = _signVoucher(escrow, OTHER_PK, v);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.EscrowEmpty.selector, other, 1 ether));
        _redeem(v, sig);
    }

    function test_redeem_drainedEscrowWithShortfall_reverts() public {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(drafter, 12 ether);
        _redeem(v, sig);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.EscrowEmpty.selector, operator, 2 ether));
        _redeem(v, sig);
        assertEq(escrow.owed(operator, drafter), 2 ether, "still owed");
    }

    function test_redeem_drafterRefusesEth_reverts() public {
        EscrowEthRefuser refuser = new EscrowEthRefuser();
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(address(refuser), 1 ether);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.TransferFailed.selector, address(refuser), 1 ether));
        refuser.callRedeem(escrow, v, sig);
        assertEq(escrow.paid(operator, address(refuser)), 0, "rolled back");
        assertEq(escrow.balanceOf(operator), ESCROWED, "escrow kept");
    }

    function test_redeem_reentrantDrafter_getsNothingExtra_succeeds() public {
        RedeemReenterer re = new RedeemReenterer(escrow);
        (DrafterEscrow.Voucher memory v1, bytes memory s1) = _signed(address(re), 1 ether);
        (DrafterEscrow.Voucher memory v2, bytes memory s2) = _signed(address(re), 3 ether);
        re.arm(v1, s1, v2, s2);

        assertEq(re.start(), 1 ether, "outer call paid its increment");
        bytes memory guardErr = abi.encodeWithSelector(ReentrancyGuard.ReentrancyGuardReentrantCall.selector);
        assertEq(keccak256(re.innerErrorSame()), keccak256(guardErr), "re-entry with the same voucher blocked");
        assertEq(keccak256(re.innerErrorNewer()), keccak256(guardErr), "re-entry with a newer voucher blocked");
        assertEq(re.received(), 1 ether, "paid once");
        assertEq(escrow.paid(operator, address(re)), 1 ether, "paid");
        assertEq(escrow.balanceOf(operator), ESCROWED - 1 ether, "escrow");
        // the newer voucher still pays its own increment, once, when redeemed normally
        assertEq(re.redeemNewer(), 2 ether, "newer voucher's increment");
        assertEq(re.received(), 3 ether, "3 ether in all: exactly the newest voucher");
        assertEq(address(escrow).balance, ESCROWED - 3 ether, "held");
    }

    function test_redeem_issuedAtNotChecked_succeeds() public {
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
        v.issuedAt = 0; // long ago
        _redeem(v, _signVoucher(escrow, OPERATOR_PK, v));
        v.cumulativeWei = 2 ether;
        v.issuedAt = type(uint64).max; // far future
        assertEq(_redeem(v, _signVoucher(escrow, OPERATOR_PK, v)), 1 ether, "informational only");
    }

    function test_redeem_duringPendingWithdrawal_succeeds() public {
        _requestWithdrawal(operator, ESCROWED);
        vm.warp(block.timestamp + DELAY - 1);
        assertEq(_pay(drafter, 4 ether), 4 ether, "the escrow stays redeemable");
        (uint256 amount,) = escrow.pendingWithdrawal(operator);
        assertEq(amount, ESCROWED, "the request itself is unchanged");
    }

    function test_redeem_afterReadyAtBeforeWithdraw_succeeds() public {
        uint64 readyAt = _requestWithdrawal(operator, ESCROWED);
        vm.warp(readyAt + 1 days);
        assertEq(_pay(drafter, 4 ether), 4 ether, "redeemable until the withdrawal actually happens");
    }

    /*//////////////////////////////////////////////////////////////
                              WITHDRAWALS
    //////////////////////////////////////////////////////////////*/

    function test_requestWithdrawal_setsPending_succeeds() public {
        uint64 expected = uint64(block.timestamp + DELAY);
        vm.expectEmit(true, false, false, true, address(escrow));
        emit DrafterEscrow.WithdrawalRequested(operator, 4 ether, expected);
        vm.prank(operator);
        escrow.requestWithdrawal(4 ether);
        (uint256 amount, uint64 readyAt) = escrow.pendingWithdrawal(operator);
        assertEq(amount, 4 ether, "amount");
        assertEq(readyAt, expected, "readyAt");
        assertEq(escrow.balanceOf(operator), ESCROWED, "nothing leaves yet");
    }

    function test_requestWithdrawal_wholeBalance_succeeds() public {
        _requestWithdrawal(operator, ESCROWED);
        (uint256 amount,) = escrow.pendingWithdrawal(operator);
        assertEq(amount, ESCROWED, "amount");
    }

    function test_requestWithdrawal_replacesEarlier_succeeds() public {
        _requestWithdrawal(operator, 2 ether);
        vm.warp(block.timestamp + DELAY - 1);
        uint64 expected = uint64(block.timestamp + DELAY);
        vm.expectEmit(true, false, false, true, address(escrow));
        emit DrafterEscrow.WithdrawalRequested(operator, 3 ether, expected);
        vm.prank(operator);
        escrow.requestWithdrawal(3 ether);
        (uint256 amount, uint64 readyAt) = escrow.pendingWithdrawal(operator);
        assertEq(amount, 3 ether, "replaced amount");
        assertEq(readyAt, expected, "the clock restarts");
        vm.warp(block.timestamp + 1); // the first request's readyAt
        vm.expectRevert(
            abi.encodeWithSelector(DrafterEscrow.WithdrawalNotReady.selector, expected, uint64(block.timestamp))
        );
        vm.prank(operator);
        escrow.withdraw();
    }

    function test_requestWithdrawal_zero_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.ZeroAmount.selector));
        vm.prank(operator);
        escrow.requestWithdrawal(0);
    }

    function test_requestWithdrawal_aboveBalance_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsBalance.selector, ESCROWED + 1, ESCROWED));
        vm.prank(operator);
        escrow.requestWithdrawal(ESCROWED + 1);
    }

    function test_requestWithdrawal_noEscrow_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.AmountExceedsBalance.selector, 1, 0));
        vm.prank(other);
        escrow.requestWithdrawal(1);
    }

    function test_cancelWithdrawal_clears_succeeds() public {
        _requestWithdrawal(operator, 4 ether);
        vm.expectEmit(true, false, false, true, address(escrow));
        emit DrafterEscrow.WithdrawalCancelled(operator, 4 ether);
        vm.prank(operator);
        escrow.cancelWithdrawal();
        (uint256 amount, uint64 readyAt) = escrow.pendingWithdrawal(operator);
        assertEq(amount + readyAt, 0, "cleared");
        vm.warp(block.timestamp + DELAY);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingWithdrawal.selector, operator));
        vm.prank(operator);
        escrow.withdraw();
    }

    function test_cancelWithdrawal_none_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingWithdrawal.selector, operator));
        vm.prank(operator);
        escrow.cancelWithdrawal();
    }

    function test_withdraw_atReadyAt_succeeds() public {
        uint64 readyAt = _requestWithdrawal(operator, 4 ether);
        vm.warp(readyAt);
        uint256 before = operator.balance;
        vm.expectEmit(true, false, false, true, address(escrow));
        emit DrafterEscrow.Withdrawn(operator, 4 ether);
        vm.prank(operator);
        assertEq(escrow.withdraw(), 4 ether, "returns the amount");
        assertEq(operator.balance, before + 4 ether, "sent");
        assertEq(escrow.balanceOf(operator), ESCROWED - 4 ether, "the rest stays");
        (uint256 amount, uint64 ready) = escrow.pendingWithdrawal(operator);
        assertEq(amount + ready, 0, "request cleared");
        assertEq(address(escrow).balance, ESCROWED - 4 ether, "held");
    }

    function test_withdraw_beforeDelay_reverts() public {
        uint64 readyAt = _requestWithdrawal(operator, 4 ether);
        vm.expectRevert(
            abi.encodeWithSelector(DrafterEscrow.WithdrawalNotReady.selector, readyAt, uint64(block.timestamp))
        );
        vm.prank(operator);
        escrow.withdraw();
        vm.warp(readyAt - 1);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.WithdrawalNotReady.selector, readyAt, readyAt - 1));
        vm.prank(operator);
        escrow.withdraw();
    }

    function test_withdraw_none_reverts() public {
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingWithdrawal.selector, operator));
        vm.prank(operator);
        escrow.withdraw();
    }

    function test_withdraw_twice_reverts() public {
        uint64 readyAt = _requestWithdrawal(operator, 4 ether);
        vm.warp(readyAt);
        vm.prank(operator);
        escrow.withdraw();
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.NoPendingWithdrawal.selector, operator));
        vm.prank(operator);
        escrow.withdraw();
    }

    function test_withdraw_afterRedemptionDuringDelay_takesOnlyRest_succeeds() public {
        uint64 readyAt = _requestWithdrawal(operator, ESCROWED);
        vm.warp(block.timestamp + 1 hours);
        _pay(drafter, 3 ether);
        vm.warp(readyAt);
        vm.expectEmit(true, false, false, true, address(escrow));
        emit DrafterEscrow.Withdrawn(operator, ESCROWED - 3 ether);
        vm.prank(operator);
        assertEq(escrow.withdraw(), ESCROWED - 3 ether, "only what redemptions left");
        assertEq(escrow.balanceOf(operator), 0, "empty");
        assertEq(address(escrow).balance, 0, "held");
    }

    function test_withdraw_partialRequestAfterRedemption_succeeds() public {
        // a request below the balance isn't cut by a redemption that leaves enough
        uint64 readyAt = _requestWithdrawal(operator, 4 ether);
        _pay(drafter, 5 ether);
        vm.warp(readyAt);
        vm.prank(operator);
        assertEq(escrow.withdraw(), 4 ether, "the request");
        assertEq(escrow.balanceOf(operator), 1 ether, "the rest");
    }

    function test_withdraw_everythingRedeemed_paysZero_succeeds() public {
        uint64 readyAt = _requestWithdrawal(operator, ESCROWED);
        _pay(drafter, ESCROWED);
        vm.warp(readyAt);
        uint256 before = operator.balance;
        vm.expectEmit(true, false, false, true, address(escrow));
        emit DrafterEscrow.Withdrawn(operator, 0);
        vm.prank(operator);
        assertEq(escrow.withdraw(), 0, "nothing left");
        assertEq(operator.balance, before, "nothing sent");
        (uint256 amount, uint64 ready) = escrow.pendingWithdrawal(operator);
        assertEq(amount + ready, 0, "request cleared");
    }

    function test_withdraw_otherEscrowsUntouched_succeeds() public {
        vm.prank(other);
        escrow.deposit{value: 5 ether}();
        uint64 readyAt = _requestWithdrawal(operator, ESCROWED);
        vm.warp(readyAt);
        vm.prank(operator);
        escrow.withdraw();
        assertEq(escrow.balanceOf(other), 5 ether, "other's escrow");
        assertEq(address(escrow).balance, 5 ether, "held: other's escrow only");
    }

    function test_withdraw_recipientRefusesEth_reverts() public {
        EscrowEthRefuser refuser = new EscrowEthRefuser();
        vm.deal(address(refuser), 1 ether);
        refuser.callDeposit{value: 1 ether}(escrow);
        refuser.callRequestWithdrawal(escrow, 1 ether);
        vm.warp(block.timestamp + DELAY);
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.TransferFailed.selector, address(refuser), 1 ether));
        refuser.callWithdraw(escrow);
        assertEq(escrow.balanceOf(address(refuser)), 1 ether, "escrow kept");
        (uint256 amount,) = escrow.pendingWithdrawal(address(refuser));
        assertEq(amount, 1 ether, "request kept");
    }

    function test_withdraw_reentrancy_reverts() public {
        WithdrawReenterer re = new WithdrawReenterer(escrow);
        re.depositAndRequest{value: 2 ether}(1 ether);
        vm.warp(block.timestamp + DELAY);
        re.start();
        assertEq(
            keccak256(re.innerError()),
            keccak256(abi.encodeWithSelector(ReentrancyGuard.ReentrancyGuardReentrantCall.selector)),
            "inner call blocked by the guard"
        );
        assertEq(re.received(), 1 ether, "paid once");
        assertEq(escrow.balanceOf(address(re)), 1 ether, "the rest stays");
    }

    /*//////////////////////////////////////////////////////////////
                               TIMELOCK
    //////////////////////////////////////////////////////////////*/

    /// The operator asks to withdraw its whole escrow while two drafters hold covered vouchers;
    /// both redeem within REDEEM_WINDOW of the request and are paid in full.
    function test_timelock_diligentDraftersPaidInFull_succeeds() public {
        (DrafterEscrow.Voucher memory a, bytes memory sa) = _signed(drafter, 4 ether);
        (DrafterEscrow.Voucher memory b, bytes memory sb) = _signed(drafter2, 6 ether);
        uint64 readyAt = _requestWithdrawal(operator, ESCROWED);
        vm.warp(block.timestamp + escrow.REDEEM_WINDOW());
        assertEq(_redeem(a, sa), 4 ether, "drafter paid in full");
        assertEq(_redeem(b, sb), 6 ether, "drafter2 paid in full");
        vm.warp(readyAt);
        vm.prank(operator);
        assertEq(escrow.withdraw(), 0, "nothing left to withdraw");
    }

    /// The same at the shortest delay the constructor allows.
    function test_timelock_minDelayLeavesRedeemWindow_succeeds() public {
        DrafterEscrow e = new DrafterEscrow(2 hours);
        vm.prank(operator);
        e.deposit{value: 1 ether}();
        DrafterEscrow.Voucher memory v = _voucher(operator, drafter, 1 ether);
        bytes memory sig = _signVoucher(e, OPERATOR_PK, v);
        vm.prank(operator);
        e.requestWithdrawal(1 ether);
        uint64 readyAt = uint64(block.timestamp + 2 hours);
        vm.warp(block.timestamp + e.REDEEM_WINDOW());
        vm.expectRevert(abi.encodeWithSelector(DrafterEscrow.WithdrawalNotReady.selector, readyAt, readyAt - 1 hours));
        vm.prank(operator);
        e.withdraw();
        vm.prank(drafter);
        assertEq(e.redeem(v, sig), 1 ether, "paid in full");
    }

    /*//////////////////////////////////////////////////////////////
                                 VIEWS
    //////////////////////////////////////////////////////////////*/

    function test_views_unknownAccounts_succeeds() public view {
        assertEq(escrow.balanceOf(depositor), 0, "balanceOf");
        assertEq(escrow.paid(operator, depositor), 0, "paid");
        assertEq(escrow.owed(operator, depositor), 0, "owed");
        (uint256 amount, uint64 readyAt) = escrow.pendingWithdrawal(depositor);
        assertEq(amount + readyAt, 0, "pendingWithdrawal");
    }
}
