// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Script} from "forge-std/Script.sol";
import {HEVM_ADDRESS, VmExtra} from "../../test/utils/TestBase.sol";

/// @notice anvil's well-known dev accounts (mnemonic "test test test test test test test test test
///         test test junk"): public knowledge, never to be used off a dev chain. The scripts' defaults
///         and roles; `test/Deploy.t.sol` checks that every key here belongs to its account.
library Anvil {
    uint256 internal constant KEY_0 = 0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80;
    uint256 internal constant KEY_1 = 0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d;
    uint256 internal constant KEY_2 = 0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a;
    uint256 internal constant KEY_3 = 0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6;
    uint256 internal constant KEY_4 = 0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a;
    uint256 internal constant KEY_5 = 0x8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba;
    uint256 internal constant KEY_6 = 0x92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e;
    uint256 internal constant KEY_9 = 0x2a871d0798f97d79848a013d4936a73bf4cc922c825d33c1cf7073dff6d409c6;

    address internal constant ACCOUNT_0 = 0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266;
    address internal constant ACCOUNT_1 = 0x70997970C51812dc3A010C7d01b50e0d17dc79C8;
    address internal constant ACCOUNT_2 = 0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC;
    address internal constant ACCOUNT_3 = 0x90F79bf6EB2c4f870365E785982E1f101E93b906;
    address internal constant ACCOUNT_4 = 0x15d34AAf54267DB7D7c367839AAf71A00a2C6A65;
    address internal constant ACCOUNT_5 = 0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc;
    address internal constant ACCOUNT_6 = 0x976EA74026E726554dB657fA54763abd0C3a0aa9;
    address internal constant ACCOUNT_9 = 0xa0Ee7A142d267C1f36714E4a8F75612F20a79720;

    /// @notice Where account 0's first deployment (nonce 0) lands on a fresh anvil.
    address internal constant FIRST_DEPLOYMENT = 0x5FbDB2315678afecb367f032d93F642f64180aa3;
}

/// @notice Base of the scripts: forge-std's `Script` (npm forge-std 1.1.2) plus the newer cheatcodes.
abstract contract DevScript is Script {
    VmExtra internal constant vmx = VmExtra(HEVM_ADDRESS);
}
