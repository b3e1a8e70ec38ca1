"""The compiled contract, its constructor config, the deployment record and anvil's dev accounts."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import asdict, dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from node.chain import ChainError
from node.chain.anvil import ANVIL_CHAIN_ID, REPO_ROOT, tool_path
from node.runtime.dirs import default_data_dir

CONTRACTS_DIR = REPO_ROOT / "contracts"
BOND = "SpecmarketBond"
ESCROW = "DrafterEscrow"
DEFAULT_DEPLOYMENTS_DIR = default_data_dir("chain") / "deployments"  # <chainId>.json, beside anvil's state
FORGE_BUILD_TIMEOUT_S = 600
ETHER = 10**18

# Anvil's well-known dev mnemonic (public; funded only on a dev chain). Roles in the local setup,
# the same as contracts/script/Deploy.s.sol: 0 deployer/owner, 1-3 referees, 4 operator,
# 5 challenger, 9 treasury.
ANVIL_MNEMONIC = "test test test test test test test test test test test junk"
DEV_DEPLOYER, DEV_REFEREES, DEV_OPERATOR, DEV_CHALLENGER, DEV_TREASURY = 0, (1, 2, 3), 4, 5, 9
DEFAULT_THRESHOLD = 2
REFEREE_SET_MARGIN_S = 3600  # the default referee-set timelock is the unbonding delay plus this
REDEEM_WINDOW_S = 3600  # a drafter redeems within this of a thaw request on its lane (DrafterEscrow.REDEEM_WINDOW)
DEFAULT_THAWING_PERIOD_S = 2 * REDEEM_WINDOW_S  # DrafterEscrow's least thawing period
DEFAULT_DRAFTER_PRICE_WEI = 10**12  # per accepted draft token: 0.000001 ETH (a 64-token answer pays < 0.0001 ETH)
DEFAULT_ESCROW_DEPOSIT_WEI = ETHER // 10  # a target tops its escrow up to this at start: 100,000 tokens' pay
DEFAULT_ESCROW_FLOOR_WEI = ETHER // 100  # below this the target warns, and /health says so
DEFAULT_LANE_DEPOSIT_WEI = ETHER // 100  # the least a drafter's lane is topped up by: 10,000 tokens' pay


@functools.cache
def dev_key(index: int) -> bytes:
    """Private key of anvil dev account ``index`` (BIP-44 m/44'/60'/0'/0/index of the dev mnemonic)."""
    from eth_account import Account  # imported when needed: it costs ~1 s of CLI start-up

    Account.enable_unaudited_hdwallet_features()
    return bytes(Account.from_mnemonic(ANVIL_MNEMONIC, account_path=f"m/44'/60'/0'/0/{index}").key)


def dev_address(index: int) -> str:
    from eth_account import Account

    return Account.from_key(dev_key(index)).address


def require_dev_chain(chain_id: int, what: str) -> None:
    """Dev keys are only for anvil: refuse to use one anywhere else."""
    if chain_id != ANVIL_CHAIN_ID:
        raise ChainError(f"{what}: anvil's public dev keys are only used on chain {ANVIL_CHAIN_ID}; pass a key file")


def parse_ether(text: str | int | float) -> int:
    """'1.5' (ETH) -> wei, exactly; a clear error for anything else."""
    try:
        value = Decimal(str(text))
    except InvalidOperation:
        raise ChainError(f"not an amount of ETH: {text!r}") from None
    wei = value * ETHER
    if not value.is_finite() or wei < 0 or wei != wei.to_integral_value():
        raise ChainError(f"not a non-negative amount of ETH with at most 18 decimals: {text!r}")
    return int(wei)


def format_ether(wei: int) -> str:
    return f"{Decimal(wei) / ETHER:f} ETH"


@dataclass(frozen=True)
class BondConfig:
    """SpecmarketBond's constructor Config (amounts in wei, durations in seconds); defaults as Deploy.s.sol."""

    min_bond: int = 1 * ETHER
    challenge_window: int = 3600
    unbonding_delay: int = 3 * 3600
    challenger_bond: int = ETHER // 10
    resolve_timeout: int = 3600
    slash_amount: int = 1 * ETHER
    challenger_reward_bps: int = 5000
    treasury: str = ""  # "" = anvil dev account 9
    # the timelock on referee-set changes; 0 = the unbonding delay plus REFEREE_SET_MARGIN_S (it must
    # exceed the unbonding delay, so an operator can leave before a new set can judge it)
    referee_set_delay: int = 0

    def as_tuple(self) -> tuple:
        treasury = self.treasury or dev_address(DEV_TREASURY)
        referee_set_delay = self.referee_set_delay or self.unbonding_delay + REFEREE_SET_MARGIN_S
        return (
            self.min_bond,
            self.challenge_window,
            self.unbonding_delay,
            self.challenger_bond,
            self.resolve_timeout,
            self.slash_amount,
            self.challenger_reward_bps,
            treasury,
            referee_set_delay,
        )


@dataclass(frozen=True)
class Deployment:
    """What `specmarket chain deploy` writes to deployments/<chainId>.json."""

    chain_id: int
    address: str
    block: int
    deployer: str
    config: BondConfig
    referees: tuple[str, ...]
    threshold: int
    escrow: str = ""  # the DrafterEscrow deployed beside the bond ("" in files written before it existed)
    thawing_period: int = 0  # ... and its thawing period, seconds

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.chain_id}.json"
        tmp = path.with_suffix(".json.tmp")
        data = {**asdict(self), "config": asdict(self.config), "referees": list(self.referees)}
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)  # atomic: a crash never leaves half a deployment file
        return path

    @classmethod
    def load(cls, directory: Path, chain_id: int) -> Deployment:
        path = directory / f"{chain_id}.json"
        try:
            data: dict[str, Any] = json.loads(path.read_text())
            return cls(
                chain_id=int(data["chain_id"]),
                address=str(data["address"]),
                block=int(data["block"]),
                deployer=str(data["deployer"]),
                config=BondConfig(**data["config"]),
                referees=tuple(data["referees"]),
                threshold=int(data["threshold"]),
                escrow=str(data.get("escrow", "")),
                thawing_period=int(data.get("thawing_period", data.get("withdrawal_delay", 0))),
            )
        except FileNotFoundError:
            raise ChainError(
                f"no deployment for chain {chain_id} in {directory}: run `specmarket chain deploy`"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ChainError(f"unreadable deployment file {path}: {exc!r}") from exc


def artifact_path(name: str) -> Path:
    """contracts/out/<name>.sol/<name>.json: forge's artifact of contract ``name``."""
    return CONTRACTS_DIR / "out" / f"{name}.sol" / f"{name}.json"


def _stale(artifact: Path) -> bool:
    if not artifact.exists():
        return True
    built = artifact.stat().st_mtime
    return any(src.stat().st_mtime > built for src in (CONTRACTS_DIR / "src").glob("*.sol"))


def forge_build(artifact: Path) -> None:
    """Compile the contracts (forge, through the npm solc shim) into contracts/out."""
    argv = [str(tool_path("forge")), "build", "--skip", "test", "--skip", "script"]
    try:
        done = subprocess.run(argv, cwd=CONTRACTS_DIR, capture_output=True, text=True, timeout=FORGE_BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise ChainError(f"forge build did not finish in {FORGE_BUILD_TIMEOUT_S} s") from exc
    if done.returncode != 0 or not artifact.exists():
        raise ChainError(f"forge build failed ({done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")


def load_artifact(name: str = BOND) -> tuple[list[dict], str]:
    """Contract ``name``'s ABI and creation bytecode, compiling first when missing or out of date."""
    artifact = artifact_path(name)
    if _stale(artifact):
        forge_build(artifact)
    data = json.loads(artifact.read_text())
    return data["abi"], data["bytecode"]["object"]
