// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {TestBase, TestUtils} from "./TestBase.sol";
import {DrafterEscrow} from "../../src/DrafterEscrow.sol";

/// @dev Voucher signing and reference hashing (no state), for the escrow's tests and handler.
abstract contract EscrowHelpers is TestBase {
    function _voucher(address op, address dr, uint256 cumulativeWei)
        internal
        view
        returns (DrafterEscrow.Voucher memory)
    {
        return DrafterEscrow.Voucher({
            operator: op, drafter: dr, cumulativeWei: cumulativeWei, issuedAt: uint64(block.timestamp)
        });
    }

    /// @dev `pk`'s signature of `v` at escrow `e`: 65 bytes r || s || v.
    function _signVoucher(DrafterEscrow e, uint256 pk, DrafterEscrow.Voucher memory v) internal returns (bytes memory) {
        return TestUtils.sign(pk, e.voucherDigest(v));
    }

    /// @dev The EIP-712 voucher digest at escrow `e`, written independently of the contract.
    function _refVoucherDigest(DrafterEscrow e, DrafterEscrow.Voucher memory v) internal view returns (bytes32) {
        bytes32 domain = keccak256(
            bytes.concat(
                keccak256("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"),
                keccak256("SpecmarketDrafterEscrow"),
                keccak256("1"),
                bytes32(block.chainid),
                bytes32(uint256(uint160(address(e))))
            )
        );
        bytes32 structHash = keccak256(
            bytes.concat(
                keccak256("Voucher(address operator,address drafter,uint256 cumulativeWei,uint64 issuedAt)"),
                bytes32(uint256(uint160(v.operator))),
                bytes32(uint256(uint160(v.drafter))),
                bytes32(v.cumulativeWei),
                bytes32(uint256(v.issuedAt))
            )
        );
        return keccak256(abi.encodePacked("\x19\x01", domain, structHash));
    }
}

/// @dev A deployed escrow (withdrawal delay 6 hours) holding 10 ether for one operator, and helpers.
abstract contract EscrowFixture is EscrowHelpers {
    DrafterEscrow internal escrow;

    uint256 internal constant DELAY = 6 hours;
    uint256 internal constant ESCROWED = 10 ether;

    uint256 internal constant OPERATOR_PK = 0xB0B;
    uint256 internal constant OTHER_PK = 0xE7E;
    address internal operator;
    address internal other; // vm.addr(OTHER_PK): a second operator, or a forger
    address internal drafter = address(0xD4A7);
    address internal drafter2 = address(0xD4A8);
    address internal depositor = address(0xDE90);

    function setUp() public virtual {
        vm.warp(1_700_000_000);
        escrow = new DrafterEscrow(DELAY);
        operator = vm.addr(OPERATOR_PK);
        other = vm.addr(OTHER_PK);
        vm.deal(operator, 100 ether);
        vm.deal(other, 100 ether);
        vm.deal(depositor, 100 ether);
        vm.prank(operator);
        escrow.deposit{value: ESCROWED}();
    }

    /// @dev The operator's voucher for `dr` over `cumulativeWei`, issued now, and its signature.
    function _signed(address dr, uint256 cumulativeWei)
        internal
        returns (DrafterEscrow.Voucher memory v, bytes memory sig)
    {
        v = _voucher(operator, dr, cumulativeWei);
        sig = _signVoucher(escrow, OPERATOR_PK, v);
    }

    /// @dev `v.drafter` redeems `v`.
    function _redeem(DrafterEscrow.Voucher memory v, bytes memory sig) internal returns (uint256) {
        vm.prank(v.drafter);
        return escrow.redeem(v, sig);
    }

    /// @dev The operator signs `cumulativeWei` for `dr`, and `dr` redeems it.
    function _pay(address dr, uint256 cumulativeWei) internal returns (uint256) {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(dr, cumulativeWei);
        return _redeem(v, sig);
    }

    function _requestWithdrawal(address op, uint256 amount) internal returns (uint64 readyAt) {
        vm.prank(op);
        escrow.requestWithdrawal(amount);
        (, readyAt) = escrow.pendingWithdrawal(op);
    }
}
