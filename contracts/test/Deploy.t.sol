// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {TestBase} from "./utils/TestBase.sol";
import {Deploy} from "../script/Deploy.s.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";

/// @dev The deploy script's defaults: anvil referees 1-3, threshold 2, validated config.
contract DeployTest is TestBase {
    function test_run_defaults_succeeds() public {
        SpecmarketBond bond = new Deploy().run();
        assertEq(bond.refereeCount(), 3, "three referees");
        assertEq(bond.threshold(), 2, "threshold 2");
        assertTrue(bond.isReferee(0x70997970C51812dc3A010C7d01b50e0d17dc79C8), "anvil 1");
        assertTrue(bond.isReferee(0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC), "anvil 2");
        assertTrue(bond.isReferee(0x90F79bf6EB2c4f870365E785982E1f101E93b906), "anvil 3");
        assertEq(bond.owner(), 0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266, "owner: anvil 0");
        assertEq(bond.treasury(), 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720, "treasury: anvil 9");
        assertEq(bond.minBond(), 1 ether, "minBond");
        assertEq(bond.challengeWindow(), 1 hours, "challengeWindow");
        assertEq(bond.resolveTimeout(), 1 hours, "resolveTimeout");
        assertEq(bond.unbondingDelay(), 3 hours, "unbondingDelay");
        assertEq(bond.challengerBond(), 0.1 ether, "challengerBond");
        assertEq(bond.slashAmount(), 1 ether, "slashAmount");
        assertEq(bond.challengerRewardBps(), 5_000, "rewardBps");
    }
}
