// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Anvil, DevScript} from "./utils/DevChain.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";
import {DrafterEscrow} from "../src/DrafterEscrow.sol";

/// @notice Deploys SpecmarketBond with three referees (anvil dev accounts 1-3) and threshold 2 as
///         referee epoch 1, then DrafterEscrow (on a fresh anvil: the bond at
///         0x5FbDB2315678afecb367f032d93F642f64180aa3, the escrow at
///         0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512, account 0's nonces 0 and 1).
///
/// Every parameter can be overridden by an environment variable SPECMARKET_<NAME> (defaults in
/// brackets; amounts in wei, durations in seconds):
///   DEPLOYER_PRIVATE_KEY [anvil account 0]   BOND_OWNER [deployer]   TREASURY [anvil account 9]
///   MIN_BOND [1 ether]   CHALLENGE_WINDOW [3600]   RESOLVE_TIMEOUT [3600]   UNBONDING_DELAY [10800]
///   CHALLENGER_BOND [0.1 ether]   SLASH_AMOUNT [1 ether]   CHALLENGER_REWARD_BPS [5000]
///   REFEREE_SET_DELAY [14400, must exceed UNBONDING_DELAY]
///   REFEREE_1..3 [anvil accounts 1-3]   REFEREE_THRESHOLD [2]
///   ESCROW_THAWING_PERIOD [7200, at least DrafterEscrow.MIN_THAWING_PERIOD]
///
///   anvil --port 8545 &
///   tools/forge script script/Deploy.s.sol --rpc-url http://127.0.0.1:8545 --broadcast
contract Deploy is DevScript {
    function run() external returns (SpecmarketBond bond, DrafterEscrow escrow) {
        uint256 deployerKey = vmx.envOr("SPECMARKET_DEPLOYER_PRIVATE_KEY", Anvil.KEY_0);
        address deployer = vm.addr(deployerKey);

        SpecmarketBond.Config memory c = SpecmarketBond.Config({
            minBond: vmx.envOr("SPECMARKET_MIN_BOND", uint256(1 ether)),
            challengeWindow: vmx.envOr("SPECMARKET_CHALLENGE_WINDOW", uint256(1 hours)),
            unbondingDelay: vmx.envOr("SPECMARKET_UNBONDING_DELAY", uint256(3 hours)),
            challengerBond: vmx.envOr("SPECMARKET_CHALLENGER_BOND", uint256(0.1 ether)),
            resolveTimeout: vmx.envOr("SPECMARKET_RESOLVE_TIMEOUT", uint256(1 hours)),
            slashAmount: vmx.envOr("SPECMARKET_SLASH_AMOUNT", uint256(1 ether)),
            challengerRewardBps: vmx.envOr("SPECMARKET_CHALLENGER_REWARD_BPS", uint256(5_000)),
            treasury: vmx.envOr("SPECMARKET_TREASURY", Anvil.ACCOUNT_9),
            refereeSetDelay: vmx.envOr("SPECMARKET_REFEREE_SET_DELAY", uint256(4 hours))
        });
        address[] memory referees = new address[](3);
        referees[0] = vmx.envOr("SPECMARKET_REFEREE_1", Anvil.ACCOUNT_1);
        referees[1] = vmx.envOr("SPECMARKET_REFEREE_2", Anvil.ACCOUNT_2);
        referees[2] = vmx.envOr("SPECMARKET_REFEREE_3", Anvil.ACCOUNT_3);
        uint256 threshold = vmx.envOr("SPECMARKET_REFEREE_THRESHOLD", uint256(2));
        address owner = vmx.envOr("SPECMARKET_BOND_OWNER", deployer);
        uint256 thawingPeriod = vmx.envOr("SPECMARKET_ESCROW_THAWING_PERIOD", uint256(2 hours));

        vmx.startBroadcast(deployerKey);
        bond = new SpecmarketBond(owner, c, referees, threshold);
        escrow = new DrafterEscrow(thawingPeriod);
        vm.stopBroadcast();
    }
}
