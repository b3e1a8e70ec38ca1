// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Script} from "forge-std/Script.sol";
import {VmExtra} from "../test/utils/TestBase.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";

/// @notice Deploys SpecmarketBond with three referees (anvil dev accounts 1-3) and threshold 2.
///
/// Every parameter can be overridden by an environment variable SPECMARKET_<NAME> (defaults in
/// brackets; amounts in wei, durations in seconds):
///   DEPLOYER_PRIVATE_KEY [anvil account 0]   BOND_OWNER [deployer]   TREASURY [anvil account 9]
///   MIN_BOND [1 ether]   CHALLENGE_WINDOW [3600]   RESOLVE_TIMEOUT [3600]   UNBONDING_DELAY [10800]
///   CHALLENGER_BOND [0.1 ether]   SLASH_AMOUNT [1 ether]   CHALLENGER_REWARD_BPS [5000]
///   REFEREE_1..3 [anvil accounts 1-3]   REFEREE_THRESHOLD [2]
///
///   anvil --port 8545 &
///   ../node_modules/.bin/forge script script/Deploy.s.sol --rpc-url http://127.0.0.1:8545 --broadcast
contract Deploy is Script {
    VmExtra internal constant vmx = VmExtra(address(uint160(uint256(keccak256("hevm cheat code")))));

    // anvil's well-known dev accounts (mnemonic "test test ... junk"); never use them off a dev chain.
    uint256 internal constant ANVIL_KEY_0 = 0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80;
    address internal constant ANVIL_1 = 0x70997970C51812dc3A010C7d01b50e0d17dc79C8;
    address internal constant ANVIL_2 = 0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC;
    address internal constant ANVIL_3 = 0x90F79bf6EB2c4f870365E785982E1f101E93b906;
    address internal constant ANVIL_9 = 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720;

    function run() external returns (SpecmarketBond bond) {
        uint256 deployerKey = vmx.envOr("SPECMARKET_DEPLOYER_PRIVATE_KEY", ANVIL_KEY_0);
        address deployer = vm.addr(deployerKey);

        SpecmarketBond.Config memory c = SpecmarketBond.Config({
            minBond: vmx.envOr("SPECMARKET_MIN_BOND", uint256(1 ether)),
            challengeWindow: vmx.envOr("SPECMARKET_CHALLENGE_WINDOW", uint256(1 hours)),
            unbondingDelay: vmx.envOr("SPECMARKET_UNBONDING_DELAY", uint256(3 hours)),
            challengerBond: vmx.envOr("SPECMARKET_CHALLENGER_BOND", uint256(0.1 ether)),
            resolveTimeout: vmx.envOr("SPECMARKET_RESOLVE_TIMEOUT", uint256(1 hours)),
            slashAmount: vmx.envOr("SPECMARKET_SLASH_AMOUNT", uint256(1 ether)),
            challengerRewardBps: vmx.envOr("SPECMARKET_CHALLENGER_REWARD_BPS", uint256(5_000)),
            treasury: vmx.envOr("SPECMARKET_TREASURY", ANVIL_9)
        });
        address[] memory referees = new address[](3);
        referees[0] = vmx.envOr("SPECMARKET_REFEREE_1", ANVIL_1);
        referees[1] = vmx.envOr("SPECMARKET_REFEREE_2", ANVIL_2);
        referees[2] = vmx.envOr("SPECMARKET_REFEREE_3", ANVIL_3);
        uint256 threshold = vmx.envOr("SPECMARKET_REFEREE_THRESHOLD", uint256(2));
        address owner = vmx.envOr("SPECMARKET_BOND_OWNER", deployer);

        vmx.startBroadcast(deployerKey);
        bond = new SpecmarketBond(owner, c, referees, threshold);
        vm.stopBroadcast();
    }
}
