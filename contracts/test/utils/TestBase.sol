// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Vm} from "forge-std/Vm.sol";

/// @dev Cheatcodes newer than npm forge-std 1.1.2's `Vm` interface (forge 1.7 implements them all).
///      That package also lacks ds-test, so its `Test.sol` does not compile; tests here build on
///      its `Vm.sol` plus these declarations and the assertion cheatcodes, not on `Test`.
interface VmExtra {
    function assertTrue(bool condition, string calldata err) external pure;
    function assertFalse(bool condition, string calldata err) external pure;
    function assertEq(uint256 a, uint256 b, string calldata err) external pure;
    function assertEq(address a, address b, string calldata err) external pure;
    function assertEq(bytes32 a, bytes32 b, string calldata err) external pure;
    function assertEq(bool a, bool b, string calldata err) external pure;
    function assertGe(uint256 a, uint256 b, string calldata err) external pure;
    function assertLe(uint256 a, uint256 b, string calldata err) external pure;
    function envOr(string calldata name, uint256 defaultValue) external view returns (uint256);
    function envOr(string calldata name, address defaultValue) external view returns (address);
    function startBroadcast(uint256 privateKey) external;
}

/// @dev Minimal test base: cheatcodes, assertions and `bound`.
abstract contract TestBase {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));
    VmExtra internal constant vmx = VmExtra(address(uint160(uint256(keccak256("hevm cheat code")))));

    /// secp256k1 group order, for building high-s (malleable) signatures.
    uint256 internal constant SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141;

    function assertTrue(bool c, string memory err) internal pure {
        vmx.assertTrue(c, err);
    }

    function assertFalse(bool c, string memory err) internal pure {
        vmx.assertFalse(c, err);
    }

    function assertEq(uint256 a, uint256 b, string memory err) internal pure {
        vmx.assertEq(a, b, err);
    }

    function assertEq(address a, address b, string memory err) internal pure {
        vmx.assertEq(a, b, err);
    }

    function assertEq(bytes32 a, bytes32 b, string memory err) internal pure {
        vmx.assertEq(a, b, err);
    }

    function assertEq(bool a, bool b, string memory err) internal pure {
        vmx.assertEq(a, b, err);
    }

    /// @dev Maps x into [min, max] (inclusive), keeping small values as they are where possible.
    function bound(uint256 x, uint256 min, uint256 max) internal pure returns (uint256) {
        require(min <= max, "bound: min > max");
        if (x >= min && x <= max) return x;
        uint256 size = max - min;
        if (size == type(uint256).max) return x;
        return min + (x % (size + 1));
    }
}
