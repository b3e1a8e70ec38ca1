// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Script} from "forge-std/Script.sol";
import {VmExtra} from "../test/utils/TestBase.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";

/// @notice Smoke test and gas measurement on a live chain (anvil): runs every dispute path
///         against a bond deployed by Deploy.s.sol with its defaults, as real transactions from
///         anvil's dev accounts. Not for any other chain.
///
///   SPECMARKET_BOND=0x... ../node_modules/.bin/forge script script/DisputeFlow.s.sol \
///       --rpc-url http://127.0.0.1:8545 --broadcast
///
/// Transactions: operator (account 4) registers; challenger (account 5) challenges a receipt with a
/// 32-token prompt and 64-token output, and another with 512 + 512 tokens; referees 1 and 2 sign
/// verdicts that the challenger submits (one at fault, one cleared); a reporter (account 6)
/// slashes an equivocation; the challenger and the treasury (account 9) withdraw.
contract DisputeFlow is Script {
    VmExtra internal constant vmx = VmExtra(address(uint160(uint256(keccak256("hevm cheat code")))));

    // anvil dev keys (mnemonic "test test ... junk"): public knowledge, dev chains only
    uint256 internal constant REF_1 = 0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d;
    uint256 internal constant REF_2 = 0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a;
    uint256 internal constant OPERATOR = 0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a;
    uint256 internal constant CHALLENGER = 0x8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba;
    uint256 internal constant REPORTER = 0x92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e;
    uint256 internal constant TREASURY = 0x2a871d0798f97d79848a013d4936a73bf4cc922c825d33c1cf7073dff6d409c6;

    bytes32 internal constant MODEL = keccak256("specmarket/dispute-flow-model");

    SpecmarketBond internal bond;

    function run() external {
        bond = SpecmarketBond(vmx.envOr("SPECMARKET_BOND", address(0x5FbDB2315678afecb367f032d93F642f64180aa3)));
        address operator = vm.addr(OPERATOR);

        vmx.startBroadcast(OPERATOR);
        bond.register{value: 5 ether}(MODEL);
        vm.stopBroadcast();

        uint256 id1 = _challengeOnce(32, 64, 1);
        uint256 id2 = _challengeOnce(512, 512, 2);

        // referees 1 and 2 (ascending by address: 0x3C44… < 0x7099…) sign verdicts off-chain
        vmx.startBroadcast(CHALLENGER);
        bond.resolve(id1, true, _verdict(id1, true));
        bond.resolve(id2, false, _verdict(id2, false));
        vm.stopBroadcast();

        _equivocation(operator);

        vmx.startBroadcast(CHALLENGER);
        bond.withdraw();
        vm.stopBroadcast();
        vmx.startBroadcast(TREASURY);
        bond.withdraw();
        vm.stopBroadcast();
    }

    function _tokens(uint256 seed, uint256 n) internal pure returns (uint32[] memory t) {
        t = new uint32[](n);
        for (uint256 i; i < n; ++i) {
            t[i] = uint32(uint256(keccak256(abi.encode(seed, i))) % 50_000);
        }
    }

    function _challengeOnce(uint256 promptLen, uint256 outputLen, uint64 seed) internal returns (uint256) {
        uint32[] memory prompt = _tokens(seed, promptLen);
        uint32[] memory output = _tokens(seed + 100, outputLen);
        SpecmarketBond.SamplingParams memory p = SpecmarketBond.SamplingParams(seed, 700_000, 50, 900_000, 1024);
        return _submit(prompt, p, output);
    }

    function _submit(uint32[] memory prompt, SpecmarketBond.SamplingParams memory p, uint32[] memory output)
        internal
        returns (uint256 id)
    {
        SpecmarketBond.Receipt memory r = SpecmarketBond.Receipt({
            operator: vm.addr(OPERATOR),
            modelHash: MODEL,
            requestHash: bond.hashRequest(prompt, p.seed, p.temperatureMicros, p.topK, p.topPMicros, p.maxTokens),
            outputHash: bond.hashOutput(output),
            tokenCount: uint32(output.length),
            issuedAt: uint64(block.timestamp)
        });
        bytes memory sig = _sign(OPERATOR, bond.receiptDigest(r));
        vmx.startBroadcast(CHALLENGER);
        id = bond.challenge{value: bond.challengerBond()}(r, sig, prompt, p, output, uint32(output.length / 2));
        vm.stopBroadcast();
    }

    function _verdict(uint256 id, bool fault) internal returns (bytes[] memory sigs) {
        bytes32 d = bond.verdictDigest(id, fault);
        (uint256 lo, uint256 hi) = vm.addr(REF_1) < vm.addr(REF_2) ? (REF_1, REF_2) : (REF_2, REF_1);
        sigs = new bytes[](2);
        sigs[0] = _sign(lo, d);
        sigs[1] = _sign(hi, d);
    }

    function _equivocation(address operator) internal {
        SpecmarketBond.Receipt memory a = SpecmarketBond.Receipt({
            operator: operator,
            modelHash: MODEL,
            requestHash: keccak256("one request"),
            outputHash: keccak256("answer A"),
            tokenCount: 16,
            issuedAt: uint64(block.timestamp)
        });
        SpecmarketBond.Receipt memory b = SpecmarketBond.Receipt({
            operator: operator,
            modelHash: MODEL,
            requestHash: keccak256("one request"),
            outputHash: keccak256("answer B"),
            tokenCount: 16,
            issuedAt: uint64(block.timestamp)
        });
        bytes memory sa = _sign(OPERATOR, bond.receiptDigest(a));
        bytes memory sb = _sign(OPERATOR, bond.receiptDigest(b));
        vmx.startBroadcast(REPORTER);
        bond.slashEquivocation(a, sa, b, sb);
        vm.stopBroadcast();
    }

    function _sign(uint256 pk, bytes32 digest) internal returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(pk, digest);
        return abi.encodePacked(r, s, v);
    }
}
