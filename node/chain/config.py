"""The chain side's configuration: every default of the chain commands, `challenge` and `referee`,
written once (the CLI reads its defaults from these fields). Importing it loads no web3."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from node.chain.anvil import DEFAULT_RPC
from node.chain.deployment import DEFAULT_DEPLOYMENTS_DIR, DEFAULT_THAWING_PERIOD_S, BondConfig
from node.model.pairs import DEFAULT_PAIR, get_pair
from node.runtime.dirs import default_data_dir

DEFAULT_POLL_S = 1.0  # a referee's look at the chain
DEFAULT_WAIT_S = 600.0  # a challenger's longest wait for the verdict


@dataclass(frozen=True)
class ChainConfig:
    """Where the chain and its deployment are: every default of the chain commands, written once."""

    rpc: str = DEFAULT_RPC
    deployments: Path = DEFAULT_DEPLOYMENTS_DIR  # folder of <chainId>.json deployment files
    state_dir: Path = field(default_factory=lambda: default_data_dir("chain"))  # a detached anvil's pid, log, state


@dataclass(frozen=True)
class DeployConfig:
    """A new SpecmarketBond (its owner, referee set, quorum and bond parameters) and DrafterEscrow."""

    deployer_key: Path | None = None  # default on anvil: dev account 0
    referees: tuple[str, ...] = ()  # default on anvil: dev accounts 1-3
    threshold: int | None = None  # default: min(DEFAULT_THRESHOLD, referees)
    bond: BondConfig = field(default_factory=BondConfig)
    thawing_period: int = DEFAULT_THAWING_PERIOD_S  # the DrafterEscrow deployed beside it, seconds


@dataclass(frozen=True)
class RefereeConfig:
    """Every default of `specmarket referee`, written once."""

    key_files: tuple[Path, ...] = ()  # default on anvil: dev accounts 1-3
    target_model: Path | None = None  # default: the pair's target
    pool: Path = field(default_factory=lambda: default_data_dir("referee") / "verdicts")  # shared verdict pool
    poll_s: float = DEFAULT_POLL_S
    pair: str = DEFAULT_PAIR  # named target/draft pair (node.model.pairs)

    @property
    def target_dir(self) -> Path:
        return get_pair(self.pair).target_dir(self.target_model)


@dataclass(frozen=True)
class ChallengeConfig:
    """Every default of `specmarket challenge`, written once."""

    receipt: Path
    key_file: Path | None = None  # default on anvil: dev account 5
    target_model: Path | None = None  # default: the pair's target
    position: int | None = None  # challenge this position instead of the audit's first wrong token
    wait: bool = False  # wait for the verdict, then withdraw the challenger's credit
    wait_s: float = DEFAULT_WAIT_S
    pair: str = DEFAULT_PAIR  # named target/draft pair (node.model.pairs)
    force: bool = False  # with position: submit it even where the audit shows it is certain to fail

    @property
    def target_dir(self) -> Path:
        return get_pair(self.pair).target_dir(self.target_model)
