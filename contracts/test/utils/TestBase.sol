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
    function snapshotState() external returns (uint256 snapshotId);
    function revertToState(uint256 snapshotId) external returns (bool success);
}

/// @dev Where forge's cheatcodes live.
address constant HEVM_ADDRESS = address(uint160(uint256(keccak256("hevm cheat code"))));

/// @dev Helpers shared by the tests and the scripts (which build on forge-std's `Script`, so they
///      can't inherit `TestBase`).
library TestUtils {
    Vm private constant VM = Vm(HEVM_ADDRESS);

    /// @dev `pk`'s signature of `digest` as the contract takes it: 65 bytes r || s || v.
    function sign(uint256 pk, bytes32 digest) internal returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = VM.sign(pk, digest);
        return abi.encodePacked(r, s, v);
    }

    /// @dev `len` pseudo-random token ids below 50,000, determined by `seed`.
    function tokens(uint256 seed, uint256 len) internal pure returns (uint32[] memory t) {
        t = new uint32[](len);
        for (uint256 i; i < len; ++i) {
            t[i] = uint32(uint256(keccak256(abi.encode(seed, i))) % 50_000);
        }
    }

    /// @dev Sorts private keys by their address, ascending, in place (insertion sort; sets are
    ///      small): the order `resolve` wants referee signatures in.
    function sortByAddress(uint256[] memory pks) internal returns (uint256[] memory) {
        address[] memory addrs = new address[](pks.length);
        for (uint256 i; i < pks.length; ++i) {
            addrs[i] = VM.addr(pks[i]);
        }
        for (uint256 i = 1; i < pks.length; ++i) {
            (uint256 k, address a) = (pks[i], addrs[i]);
            uint256 j = i;
            while (j > 0 && addrs[j - 1] > a) {
                (pks[j], addrs[j]) = (pks[j - 1], addrs[j - 1]);
                --j;
            }
            (pks[j], addrs[j]) = (k, a);
        }
        return pks;
    }
}

/// @dev Minimal test base: cheatcodes, assertions and `bound`.
abstract contract TestBase {
    Vm internal constant vm = Vm(HEVM_ADDRESS);
    VmExtra internal constant vmx = VmExtra(HEVM_ADDRESS);

    /// secp256k1 group order, for building high-s (malleable) signatures.
    uint256 internal constant SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141;

    function _split(bytes memory sig) internal pure returns (uint8 v, bytes32 r, bytes32 s) {
        assembly {
            r := mload(add(sig, 0x20))
            s := mload(add(sig, 0x40))
            v := byte(0, mload(add(sig, 0x60)))
        }
    }

    /// @dev The malleable twin of a valid signature: (r, n - s, v ^ 1). ecrecover accepts it.
    function _highS(bytes memory sig) internal pure returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = _split(sig);
        return abi.encodePacked(r, bytes32(SECP256K1_N - uint256(s)), v == 27 ? uint8(28) : uint8(27));
    }

    /// @dev What `ecrecover` yields for `sig` over `digest` (for expected-revert arguments).
    function _recover(bytes32 digest, bytes memory sig) internal pure returns (address) {
        (uint8 v, bytes32 r, bytes32 s) = _split(sig);
        return ecrecover(digest, v, r, s);
    }

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

    function assertGe(uint256 a, uint256 b, string memory err) internal pure {
        vmx.assertGe(a, b, err);
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
