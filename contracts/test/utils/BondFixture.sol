// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {TestBase, TestUtils} from "./TestBase.sol";
import {SpecmarketBond} from "../../src/SpecmarketBond.sol";

/// @dev Shared signing and encoding helpers (no state), for tests and the invariant handler.
abstract contract BondHelpers is TestBase {
    /// @dev The receipt store nonce of the fixtures' receipts (one store signs them all).
    uint64 internal constant STORE_NONCE = 0x5707E;

    /// @dev `n` referee keys firstPk, firstPk + 1, ... sorted by address, and their addresses in
    ///      the same order.
    function _refereeKeys(uint256 firstPk, uint256 n) internal returns (uint256[] memory pks, address[] memory addrs) {
        pks = new uint256[](n);
        for (uint256 i; i < n; ++i) {
            pks[i] = firstPk + i;
        }
        pks = TestUtils.sortByAddress(pks);
        addrs = new address[](n);
        for (uint256 i; i < n; ++i) {
            addrs[i] = vm.addr(pks[i]);
        }
    }

    /// @dev Reference hashing, written independently of the contract: 32-byte big-endian words.
    function _refHashTokens(uint32[] memory t) internal pure returns (bytes32) {
        bytes memory b = new bytes(32 * t.length);
        for (uint256 i; i < t.length; ++i) {
            bytes32 word = bytes32(uint256(t[i]));
            assembly {
                mstore(add(add(b, 0x20), mul(i, 0x20)), word)
            }
        }
        return keccak256(b);
    }

    function _refHashRequest(uint32[] memory prompt, SpecmarketBond.SamplingParams memory p)
        internal
        pure
        returns (bytes32)
    {
        bytes32 typehash = keccak256(
            "Request(bytes32 promptHash,uint64 seed,uint32 temperatureMicros,uint32 topK,uint32 topPMicros,uint32 maxTokens,bytes32 stopHash)"
        );
        return keccak256(
            bytes.concat(
                typehash,
                _refHashTokens(prompt),
                bytes32(uint256(p.seed)),
                bytes32(uint256(p.temperatureMicros)),
                bytes32(uint256(p.topK)),
                bytes32(uint256(p.topPMicros)),
                bytes32(uint256(p.maxTokens)),
                p.stopHash
            )
        );
    }

    function _params(uint64 seed) internal pure returns (SpecmarketBond.SamplingParams memory) {
        return SpecmarketBond.SamplingParams({
            seed: seed,
            temperatureMicros: 700_000,
            topK: 50,
            topPMicros: 900_000,
            maxTokens: 64,
            stopHash: keccak256("")
        });
    }

    function _receipt(
        address operator,
        bytes32 modelHash,
        uint32[] memory prompt,
        SpecmarketBond.SamplingParams memory p,
        uint32[] memory output,
        uint64 issuedAt
    ) internal pure returns (SpecmarketBond.Receipt memory) {
        return SpecmarketBond.Receipt({
            operator: operator,
            modelHash: modelHash,
            requestHash: _refHashRequest(prompt, p),
            outputHash: _refHashTokens(output),
            tokenCount: uint32(output.length),
            issuedAt: issuedAt,
            storeNonce: STORE_NONCE
        });
    }

    /// @dev Verdict signatures by `pks` on challenge `id` as `b` stores it (an unused id's fields
    ///      are all zero).
    function _verdictSigs(SpecmarketBond b, uint256 id, bool fault, uint256[] memory pks)
        internal
        returns (bytes[] memory sigs)
    {
        SpecmarketBond.Challenge memory c = b.getChallenge(id);
        return _signDigest(b.verdictDigest(id, c.receiptDigest, c.position, c.challenger, fault), pks);
    }

    /// @dev The EIP-712 verdict digest, written independently of the contract.
    function _refVerdictDigest(
        SpecmarketBond b,
        uint256 id,
        bytes32 receiptDigest,
        uint32 position,
        address challenger_,
        bool fault
    ) internal view returns (bytes32) {
        bytes32 typehash = keccak256(
            "Verdict(uint256 challengeId,bytes32 receiptDigest,uint32 position,address challenger,bool operatorAtFault)"
        );
        bytes32 structHash = keccak256(
            bytes.concat(
                typehash,
                bytes32(id),
                receiptDigest,
                bytes32(uint256(position)),
                bytes32(uint256(uint160(challenger_))),
                bytes32(uint256(fault ? 1 : 0))
            )
        );
        return keccak256(abi.encodePacked("\x19\x01", b.domainSeparator(), structHash));
    }

    function _signDigest(bytes32 digest, uint256[] memory pks) internal returns (bytes[] memory sigs) {
        sigs = new bytes[](pks.length);
        for (uint256 i; i < pks.length; ++i) {
            sigs[i] = TestUtils.sign(pks[i], digest);
        }
    }
}

/// @dev A deployed bond with three referees (threshold 2), one registered operator and helpers.
abstract contract BondFixture is BondHelpers {
    SpecmarketBond internal bond;

    uint256 internal constant MIN_BOND = 1 ether;
    uint256 internal constant CHALLENGE_WINDOW = 1 days;
    uint256 internal constant RESOLVE_TIMEOUT = 3 days;
    uint256 internal constant UNBONDING_DELAY = 7 days;
    uint256 internal constant CHALLENGER_BOND = 0.1 ether;
    uint256 internal constant SLASH_AMOUNT = 0.5 ether;
    uint256 internal constant REWARD_BPS = 5_000;
    uint256 internal constant REFEREE_SET_DELAY = 8 days; // > UNBONDING_DELAY

    address internal owner = address(0x0A11CE);
    address internal treasury = address(0x7EA5);
    address internal challenger = address(0xC4A1);
    address internal reporter = address(0x4E90);

    uint256 internal constant OPERATOR_PK = 0xB0B;
    uint256 internal constant OTHER_PK = 0xE7E;
    address internal operator;
    bytes32 internal constant MODEL = keccak256("specmarket/target-model");

    uint256[] internal refPks; // sorted by address
    address[] internal refAddrs; // same order

    uint32[] internal prompt;
    uint32[] internal output;
    SpecmarketBond.SamplingParams internal params;

    function _config() internal view returns (SpecmarketBond.Config memory) {
        return SpecmarketBond.Config({
            minBond: MIN_BOND,
            challengeWindow: CHALLENGE_WINDOW,
            unbondingDelay: UNBONDING_DELAY,
            challengerBond: CHALLENGER_BOND,
            resolveTimeout: RESOLVE_TIMEOUT,
            slashAmount: SLASH_AMOUNT,
            challengerRewardBps: REWARD_BPS,
            treasury: treasury,
            refereeSetDelay: REFEREE_SET_DELAY
        });
    }

    function setUp() public virtual {
        vm.warp(1_700_000_000);
        (refPks, refAddrs) = _refereeKeys(0xA1, 3);
        bond = new SpecmarketBond(owner, _config(), refAddrs, 2);

        operator = vm.addr(OPERATOR_PK);
        vm.deal(operator, 100 ether);
        vm.deal(challenger, 100 ether);
        vm.deal(reporter, 1 ether);
        vm.prank(operator);
        bond.register{value: 2 ether}(MODEL);

        prompt = TestUtils.tokens(1, 5);
        output = TestUtils.tokens(2, 8);
        params = _params(42);
    }

    // -- receipts ---------------------------------------------------------------------------

    function _goodReceipt() internal view returns (SpecmarketBond.Receipt memory) {
        return _receipt(operator, MODEL, prompt, params, output, uint64(block.timestamp));
    }

    function _signReceipt(uint256 pk, SpecmarketBond.Receipt memory r) internal returns (bytes memory) {
        return TestUtils.sign(pk, bond.receiptDigest(r));
    }

    /// @dev The fixture's receipt (issued now) and the operator's signature of it.
    function _signedReceipt() internal returns (SpecmarketBond.Receipt memory r, bytes memory sig) {
        r = _goodReceipt();
        sig = _signReceipt(OPERATOR_PK, r);
    }

    // -- challenges -------------------------------------------------------------------------

    function _challenge(SpecmarketBond.Receipt memory r, bytes memory sig, uint32 position)
        internal
        returns (uint256 id)
    {
        vm.prank(challenger);
        id = bond.challenge{value: CHALLENGER_BOND}(r, sig, prompt, params, output, position);
    }

    function _openChallenge() internal returns (uint256 id) {
        (SpecmarketBond.Receipt memory r, bytes memory sig) = _signedReceipt();
        id = _challenge(r, sig, 3);
    }

    /// @dev Signatures of the first `m` referees (in ascending address order).
    function _quorum(uint256 id, bool fault, uint256 m) internal returns (bytes[] memory) {
        uint256[] memory pks = new uint256[](m);
        for (uint256 i; i < m; ++i) {
            pks[i] = refPks[i];
        }
        return _verdictSigs(bond, id, fault, pks);
    }

    // -- referee epochs ---------------------------------------------------------------------

    /// @dev The owner proposes `members` with threshold `m`; the delay passes; anyone activates.
    function _activateSet(address[] memory members, uint256 m) internal returns (uint256 epoch) {
        vm.prank(owner);
        uint256 eta = bond.proposeRefereeSet(members, m);
        vm.warp(eta);
        bond.activateRefereeSet();
        epoch = bond.refereeEpoch();
    }

    // -- operators --------------------------------------------------------------------------

    /// @dev `op` requests unbonding, waits out the delay and withdraws its bond (to a credit).
    function _leave(address op) internal {
        vm.prank(op);
        bond.requestUnbond();
        vm.warp(block.timestamp + UNBONDING_DELAY);
        vm.prank(op);
        bond.withdrawBond();
    }

    function _bondOf(address op) internal view returns (uint256 b) {
        (,,, b,,) = bond.operatorInfo(op);
    }

    function _openOf(address op) internal view returns (uint256 n) {
        (,,,,, n) = bond.operatorInfo(op);
    }
}
