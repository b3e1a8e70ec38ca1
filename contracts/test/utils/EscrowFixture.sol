// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {TestBase, TestUtils} from "./TestBase.sol";
import {DrafterEscrow} from "../../src/DrafterEscrow.sol";

/// @dev Voucher signing, reference hashing and lane reads (no state), for the escrow's tests and
///      handler.
abstract contract EscrowHelpers is TestBase {
    /// @dev `DrafterEscrow.lane(...)`'s five values, by name.
    struct LaneState {
        uint256 balance;
        uint256 paid;
        uint256 owed;
        uint256 thawing;
        uint64 readyAt;
    }

    function _voucher(address op, address dr, uint64 laneId, uint256 cumulativeWei)
        internal
        view
        returns (DrafterEscrow.Voucher memory)
    {
        return DrafterEscrow.Voucher({
            operator: op, drafter: dr, lane: laneId, cumulativeWei: cumulativeWei, issuedAt: uint64(block.timestamp)
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
                keccak256("2"),
                bytes32(block.chainid),
                bytes32(uint256(uint160(address(e))))
            )
        );
        bytes32 structHash = keccak256(
            bytes.concat(
                keccak256(
                    "Voucher(address operator,address drafter,uint64 lane,uint256 cumulativeWei,uint64 issuedAt)"
                ),
                bytes32(uint256(uint160(v.operator))),
                bytes32(uint256(uint160(v.drafter))),
                bytes32(uint256(v.lane)),
                bytes32(v.cumulativeWei),
                bytes32(uint256(v.issuedAt))
            )
        );
        return keccak256(abi.encodePacked("\x19\x01", domain, structHash));
    }

    function _laneOf(DrafterEscrow e, address op, address dr, uint64 laneId)
        internal
        view
        returns (LaneState memory s)
    {
        (s.balance, s.paid, s.owed, s.thawing, s.readyAt) = e.lane(op, dr, laneId);
    }
}

/// @dev A deployed escrow (thawing period 6 hours): the operator's pool holds 5 ether and its lane
///      LANE for `drafter` 10 ether; helpers.
abstract contract EscrowFixture is EscrowHelpers {
    DrafterEscrow internal escrow;

    uint256 internal constant PERIOD = 6 hours;
    uint256 internal constant POOLED = 5 ether;
    uint256 internal constant LANED = 10 ether;
    uint64 internal constant LANE = 7;
    uint64 internal constant LANE_B = 8;

    uint256 internal constant OPERATOR_PK = 0xB0B;
    uint256 internal constant OTHER_PK = 0xE7E;
    address internal operator;
    address internal other; // vm.addr(OTHER_PK): a second operator, or a forger
    address internal drafter = address(0xD4A7);
    address internal drafter2 = address(0xD4A8);
    address internal depositor = address(0xDE90);

    function setUp() public virtual {
        vm.warp(1_700_000_000);
        escrow = new DrafterEscrow(PERIOD);
        operator = vm.addr(OPERATOR_PK);
        other = vm.addr(OTHER_PK);
        vm.deal(operator, 100 ether);
        vm.deal(other, 100 ether);
        vm.deal(depositor, 100 ether);
        vm.startPrank(operator);
        escrow.deposit{value: POOLED + LANED}();
        escrow.fundLane(drafter, LANE, LANED);
        vm.stopPrank();
    }

    /// @dev The operator's voucher for `dr` on `laneId` over `cumulativeWei`, issued now, and its
    ///      signature.
    function _signed(address dr, uint64 laneId, uint256 cumulativeWei)
        internal
        returns (DrafterEscrow.Voucher memory v, bytes memory sig)
    {
        v = _voucher(operator, dr, laneId, cumulativeWei);
        sig = _signVoucher(escrow, OPERATOR_PK, v);
    }

    /// @dev `v.drafter` redeems `v`.
    function _redeem(DrafterEscrow.Voucher memory v, bytes memory sig) internal returns (uint256) {
        vm.prank(v.drafter);
        return escrow.redeem(v, sig);
    }

    /// @dev The operator signs `cumulativeWei` for `dr` on `laneId`, and `dr` redeems it.
    function _pay(address dr, uint64 laneId, uint256 cumulativeWei) internal returns (uint256) {
        (DrafterEscrow.Voucher memory v, bytes memory sig) = _signed(dr, laneId, cumulativeWei);
        return _redeem(v, sig);
    }

    function _requestThaw(address op, address dr, uint64 laneId, uint256 amount) internal returns (uint64 readyAt) {
        vm.prank(op);
        escrow.requestThaw(dr, laneId, amount);
        (,,,, readyAt) = escrow.lane(op, dr, laneId);
    }

    /// @dev The fixture lane (operator, drafter, LANE).
    function _main() internal view returns (LaneState memory) {
        return _laneOf(escrow, operator, drafter, LANE);
    }
}
