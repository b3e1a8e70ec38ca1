// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {TestBase} from "./utils/TestBase.sol";
import {Deploy} from "../script/Deploy.s.sol";
import {Anvil} from "../script/utils/DevChain.sol";
import {SpecmarketBond} from "../src/SpecmarketBond.sol";
import {DrafterEscrow} from "../src/DrafterEscrow.sol";

/// @dev The deploy script's defaults: anvil referees 1-3, threshold 2 (epoch 1), validated config;
///      the drafter escrow beside the bond.
contract DeployTest is TestBase {
    function test_run_defaults_succeeds() public {
        (SpecmarketBond bond, DrafterEscrow escrow) = new Deploy().run();
        assertEq(bond.refereeCount(), 3, "three referees");
        assertEq(bond.threshold(), 2, "threshold 2");
        assertTrue(bond.isReferee(Anvil.ACCOUNT_1), "anvil 1");
        assertTrue(bond.isReferee(Anvil.ACCOUNT_2), "anvil 2");
        assertTrue(bond.isReferee(Anvil.ACCOUNT_3), "anvil 3");
        assertEq(bond.owner(), Anvil.ACCOUNT_0, "owner: anvil 0");
        assertEq(bond.treasury(), Anvil.ACCOUNT_9, "treasury: anvil 9");
        assertEq(bond.minBond(), 1 ether, "minBond");
        assertEq(bond.challengeWindow(), 1 hours, "challengeWindow");
        assertEq(bond.resolveTimeout(), 1 hours, "resolveTimeout");
        assertEq(bond.unbondingDelay(), 3 hours, "unbondingDelay");
        assertEq(bond.challengerBond(), 0.1 ether, "challengerBond");
        assertEq(bond.slashAmount(), 1 ether, "slashAmount");
        assertEq(bond.challengerRewardBps(), 5_000, "rewardBps");
        assertEq(bond.refereeSetDelay(), 4 hours, "refereeSetDelay");
        assertTrue(bond.refereeSetDelay() > bond.unbondingDelay(), "refereeSetDelay > unbondingDelay");
        assertEq(bond.refereeEpoch(), 1, "epoch 1");
        assertEq(bond.thresholdAt(1), 2, "epoch 1 threshold");
        (address[] memory pending,, uint256 eta) = bond.pendingRefereeSet();
        assertEq(pending.length + eta, 0, "no pending proposal");
        assertEq(escrow.thawingPeriod(), 2 hours, "escrow thawingPeriod");
        assertTrue(address(escrow) != address(bond), "a separate contract");
    }

    /// The scripts' hard-coded anvil keys and accounts belong together.
    function test_anvil_keysMatchAccounts_succeeds() public {
        assertEq(vm.addr(Anvil.KEY_0), Anvil.ACCOUNT_0, "account 0");
        assertEq(vm.addr(Anvil.KEY_1), Anvil.ACCOUNT_1, "account 1");
        assertEq(vm.addr(Anvil.KEY_2), Anvil.ACCOUNT_2, "account 2");
        assertEq(vm.addr(Anvil.KEY_3), Anvil.ACCOUNT_3, "account 3");
        assertEq(vm.addr(Anvil.KEY_4), Anvil.ACCOUNT_4, "account 4");
        assertEq(vm.addr(Anvil.KEY_5), Anvil.ACCOUNT_5, "account 5");
        assertEq(vm.addr(Anvil.KEY_6), Anvil.ACCOUNT_6, "account 6");
        assertEq(vm.addr(Anvil.KEY_9), Anvil.ACCOUNT_9, "account 9");
    }
}
