// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Anvil, DevScript} from "./utils/DevChain.sol";
import {TestUtils} from "../test/utils/TestBase.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";

/// @notice Smoke test and gas measurement on a live chain (anvil): runs every dispute path
///         against a bond deployed by Deploy.s.sol with its defaults, as real transactions from
///         anvil's dev accounts. Not for any other chain.
///
///   SPECMARKET_BOND=0x... tools/forge script script/DisputeFlow.s.sol \
///       --rpc-url http://127.0.0.1:8545 --broadcast
///
/// Transactions: operator (account 4) registers; challenger (account 5) challenges a receipt with a
/// 32-token prompt and 64-token output, and another with 512 + 512 tokens; referees 1 and 2 sign
/// verdicts (bound to each challenge's id, receipt digest, position and challenger) that the
/// challenger submits (one at fault, one cleared); a reporter (account 6) slashes an
/// equivocation; the challenger and the treasury (account 9) withdraw; the owner (account 0)
/// proposes a next referee set and cancels it (activation needs refereeSetDelay to pass, which a
/// script on a live chain can't wait for).
contract DisputeFlow is DevScript {
    // roles, by anvil dev key (Deploy.s.sol's defaults make accounts 1-3 referees, 9 the treasury)
    uint256 internal constant OWNER = Anvil.KEY_0;
    uint256 internal constant REF_1 = Anvil.KEY_1;
    uint256 internal constant REF_2 = Anvil.KEY_2;
    uint256 internal constant OPERATOR = Anvil.KEY_4;
    uint256 internal constant CHALLENGER = Anvil.KEY_5;
    uint256 internal constant REPORTER = Anvil.KEY_6;
    uint256 internal constant TREASURY = Anvil.KEY_9;

    bytes32 internal constant MODEL = keccak256("specmarket/dispute-flow-model");
    uint64 internal constant STORE_NONCE = 1; // one receipt store signs the flow's receipts

    SpecmarketBond internal bond;

    function run() external {
        bond = SpecmarketBond(vmx.envOr("SPECMARKET_BOND", Anvil.FIRST_DEPLOYMENT));
        address operator = vm.addr(OPERATOR);

        vmx.startBroadcast(OPERATOR);
        bond.register{value: 5 ether}(MODEL);
        vm.stopBroadcast();

        uint256 id1 = _challengeOnce(32, 64, 1);
        uint256 id2 = _challengeOnce(512, 512, 2);

        // referees 1 and 2 sign verdicts off-chain (sorted by address: 0x3C44… < 0x7099…)
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

        address[] memory next = new address[](3);
        (next[0], next[1], next[2]) = (Anvil.ACCOUNT_1, Anvil.ACCOUNT_2, Anvil.ACCOUNT_6);
        vmx.startBroadcast(OWNER);
        bond.proposeRefereeSet(next, 2);
        bond.cancelRefereeSet();
        vm.stopBroadcast();
    }

    function _challengeOnce(uint256 promptLen, uint256 outputLen, uint64 seed) internal returns (uint256) {
        uint32[] memory prompt = TestUtils.tokens(seed, promptLen);
        uint32[] memory output = TestUtils.tokens(seed + 100, outputLen);
        SpecmarketBond.SamplingParams memory p =
            SpecmarketBond.SamplingParams(seed, 700_000, 50, 900_000, 1024, keccak256(""));
        return _submit(prompt, p, output);
    }

    function _submit(uint32[] memory prompt, SpecmarketBond.SamplingParams memory p, uint32[] memory output)
        internal
        returns (uint256 id)
    {
        SpecmarketBond.Receipt memory r = SpecmarketBond.Receipt({
            operator: vm.addr(OPERATOR),
            modelHash: MODEL,
            requestHash: bond.hashRequest(prompt, p),
            outputHash: bond.hashOutput(output),
            tokenCount: uint32(output.length),
            issuedAt: uint64(block.timestamp),
            storeNonce: STORE_NONCE
        });
        bytes memory sig = TestUtils.sign(OPERATOR, bond.receiptDigest(r));
        vmx.startBroadcast(CHALLENGER);
        id = bond.challenge{value: bond.challengerBond()}(r, sig, prompt, p, output, uint32(output.length / 2));
        vm.stopBroadcast();
    }

    function _verdict(uint256 id, bool fault) internal returns (bytes[] memory sigs) {
        SpecmarketBond.Challenge memory c = bond.getChallenge(id);
        bytes32 d = bond.verdictDigest(id, c.receiptDigest, c.position, c.challenger, fault);
        uint256[] memory pks = new uint256[](2);
        (pks[0], pks[1]) = (REF_1, REF_2);
        pks = TestUtils.sortByAddress(pks);
        sigs = new bytes[](2);
        sigs[0] = TestUtils.sign(pks[0], d);
        sigs[1] = TestUtils.sign(pks[1], d);
    }

    function _equivocation(address operator) internal {
        SpecmarketBond.Receipt memory a = _answer(operator, keccak256("answer A"));
        SpecmarketBond.Receipt memory b = _answer(operator, keccak256("answer B"));
        bytes memory sa = TestUtils.sign(OPERATOR, bond.receiptDigest(a));
        bytes memory sb = TestUtils.sign(OPERATOR, bond.receiptDigest(b));
        vmx.startBroadcast(REPORTER);
        bond.slashEquivocation(a, sa, b, sb);
        vm.stopBroadcast();
    }

    /// @dev A 16-token answer to one fixed request, issued now.
    function _answer(address operator, bytes32 outputHash) internal view returns (SpecmarketBond.Receipt memory) {
        return SpecmarketBond.Receipt({
            operator: operator,
            modelHash: MODEL,
            requestHash: keccak256("one request"),
            outputHash: outputHash,
            tokenCount: 16,
            issuedAt: uint64(block.timestamp),
            storeNonce: STORE_NONCE
        });
    }
}
