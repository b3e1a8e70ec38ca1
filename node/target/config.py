"""The target node's configuration: every default of `specmarket target` is written here, once.

The CLI reads its defaults from these fields (``node.cli.options``), a ``[target]`` table of a TOML
file may override them, and command-line flags override both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from market.policy import DEFAULT_DEADLINE_MS
from node.chain.cheat import Cheat
from node.chain.deployment import (
    DEFAULT_DEPLOYMENTS_DIR,
    DEFAULT_DRAFTER_PRICE_WEI,
    DEFAULT_ESCROW_DEPOSIT_WEI,
    DEFAULT_ESCROW_FLOOR_WEI,
    DEFAULT_LANE_DEPOSIT_WEI,
    format_ether,
    parse_ether,
)
from node.chain.keys import OPERATOR_KEY_FILE
from node.model.kernels import DEFAULT_KERNEL, KERNELS
from node.model.pairs import DEFAULT_PAIR, get_pair
from node.runtime.dirs import default_data_dir
from p2p.messages import DEFAULT_LISTEN, MAX_OPEN_DEADLINE_MS, MAX_PRICE_WEI
from verifier.errors import InvalidParams
from verifier.proposal import MAX_GAMMA, TARGET_GAMMA
from verifier.tree import DEFAULT_TREE_NODES, MAX_TREE_NODES

if TYPE_CHECKING:
    from node.chain.operator import OperatorConfig

MAX_DRAFTERS = 64
MAX_DEADLINE_MS = float(MAX_OPEN_DEADLINE_MS)  # the most a target waits, and the most its open can state
DEFAULT_HTTP = "127.0.0.1:8000"

# Bounded load (docs/design.md, "Bounded load"): jobs running at once, over HTTP and libp2p together;
# one more is refused at once (HTTP 503 with Retry-After, a libp2p error frame), never queued.
DEFAULT_MAX_JOBS = 8
# rows of one shared verification pass (node.target.batching); 0 turns batching off
DEFAULT_BATCH_ROWS = 16
MAX_BATCH_ROWS = 512
MAX_JOBS_LIMIT = 1024
# Deadlines of the HTTP API (node.target.http.api); every one of them drops a stalled client.
HTTP_BODY_TIMEOUT_S = 10.0  # a client must send its whole body this soon (else 408)
HTTP_WRITE_TIMEOUT_S = 30.0  # a client that takes no data this long loses its job and its connection
HTTP_IDLE_TIMEOUT_S = 5.0  # a connection with no request under way (or half its headers) is closed
HTTP_READ_TIMEOUT_S = 600.0  # backstop: a connection silent this long is closed; longer than any job
MAX_HTTP_TIMEOUT_S = 3600.0


# The draft deadline a target sets itself: DEADLINE_PLAIN_PASSES of its own measured plain decoding
# step, at least DEFAULT_DEADLINE_MS. A fresh γ-token answer takes the drafter about γ + 1 draft
# passes; waiting for it pays while (wait + t(γ+1)) / E[tokens per round] < t(1), which at the
# qwen2.5-coder pair's α ≈ 0.86, γ = 4 and v ≈ 1.5 allows waits up to ~2.3 plain steps.
DEADLINE_PLAIN_PASSES = 2.0


def auto_deadline_ms(plain_pass_s: float) -> float:
    """The draft deadline of a target whose plain decoding step takes ``plain_pass_s``."""
    return min(MAX_DEADLINE_MS, max(DEFAULT_DEADLINE_MS, DEADLINE_PLAIN_PASSES * plain_pass_s * 1000))


# Wasted waiting for drafts may cost at most this share of a job's time (and half a deadline) unless
# the job still beats plain decoding; past it the job decodes alone (wait_budget.WaitBudget._over_budget).
WAIT_BUDGET_SHARE = 0.05


# The most draft tokens one round verifies. Honest drafters end a block early at a token they are
# unsure of (node.drafter.config.DEFAULT_MIN_CONFIDENCE), so rounds are this long only where the
# draft is confident: chosen with it on the qwen2.5-coder pair (docs/target-performance.md).
# TARGET_GAMMA lives in verifier.proposal, so that `generate` defaults to it too.

# The first round's pass prefills the prompt, many times a one-position pass. It is decoded alone: the
# target sends the drafters the prompt and prefills at once, while they prefill and draft their first
# block; that block (less the token the prefill emitted, when the drafter predicted it) answers the
# second round as soon as it is asked. Waiting for a first draft instead put the drafter's prefill
# and first block in front of the target's (docs/target-performance.md, "The first chunk").
PREFILL_ALONE = True


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP API's deadlines in seconds (``node.target.http.api``; the defaults above)."""

    body_timeout_s: float = HTTP_BODY_TIMEOUT_S
    write_timeout_s: float = HTTP_WRITE_TIMEOUT_S
    idle_timeout_s: float = HTTP_IDLE_TIMEOUT_S
    read_timeout_s: float = HTTP_READ_TIMEOUT_S


@dataclass(frozen=True)
class TargetConfig:
    listen: str = DEFAULT_LISTEN  # libp2p listen multiaddr
    http: str = DEFAULT_HTTP  # HTTP API HOST:PORT (port 0 = any free port)
    data_dir: Path = field(default_factory=lambda: default_data_dir("target"))  # identity, ledger, receipts
    gamma: int = TARGET_GAMMA  # the most draft tokens a round verifies (drafters may send fewer)
    draft_deadline_ms: float | None = None  # the longest wait for drafts per round; None: auto_deadline_ms
    max_drafters: int = 4  # drafters asked per job; 0 = plain decoding
    # share of a job that wasted waiting for drafts may cost before a job slower than plain decoding
    # stops drafting (node.target.rounds); 0 turns the budget off (the lab measures speculation as such)
    wait_budget: float = WAIT_BUDGET_SHARE
    # 32 tokens judge a drafter: an honest one (per-token match ~0.5-0.7) matches nothing in 8 rounds
    # with probability ~0.3^8 < 1e-4, while a useless one costs half a 64-token trial
    judge_after_tokens: int = 32
    pair: str = DEFAULT_PAIR  # named target/draft pair (node.model.pairs)
    target_model: Path | None = None  # default: the pair's target
    draft_model: Path | None = None  # default: the pair's draft; loaded only for --cheat draft-model
    kernel: str = DEFAULT_KERNEL  # the target's linear-layer kernel (node.model.kernels): speed only
    chain: str | None = None  # JSON-RPC URL: bond there and sign a receipt for every answer; None: unbonded
    deployments: Path = DEFAULT_DEPLOYMENTS_DIR
    operator_key: Path | None = None  # default: DATA_DIR/keys/operator.key
    bond: str | None = None  # ETH; None: the contract's minimum
    # drafters are paid from the DrafterEscrow (a bonded node only): wei per accepted draft token
    drafter_price: int = DEFAULT_DRAFTER_PRICE_WEI
    escrow_deposit: str = format_ether(DEFAULT_ESCROW_DEPOSIT_WEI).removesuffix(" ETH")  # topped up to at start
    escrow_floor: str = format_ether(DEFAULT_ESCROW_FLOOR_WEI).removesuffix(" ETH")  # below it: warn, /health says so
    lane_deposit: str = format_ether(DEFAULT_LANE_DEPOSIT_WEI).removesuffix(" ETH")  # least lane top-up
    cheat: Cheat = Cheat.NONE  # a DISHONEST operator, for tests and demos
    new_receipt_store: bool = False  # start a new receipt store where the old one is missing or unusable
    max_jobs: int = DEFAULT_MAX_JOBS  # jobs at once (HTTP and libp2p); one more is refused, not queued
    batch_rows: int = DEFAULT_BATCH_ROWS  # concurrent jobs share verification passes of up to this many rows
    tree_nodes: int = DEFAULT_TREE_NODES  # a round's drafts merged into a tree of up to this many nodes; 0 = off
    open_dashboard: bool = False  # open the live dashboard (GET /) in a web browser once serving
    http_body_timeout_s: float = HTTP_BODY_TIMEOUT_S
    http_write_timeout_s: float = HTTP_WRITE_TIMEOUT_S
    http_idle_timeout_s: float = HTTP_IDLE_TIMEOUT_S
    http_read_timeout_s: float = HTTP_READ_TIMEOUT_S

    def __post_init__(self) -> None:
        get_pair(self.pair)
        if self.kernel not in KERNELS:
            raise InvalidParams(f"--kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if not 1 <= self.gamma <= MAX_GAMMA:
            raise InvalidParams(f"--gamma must be in [1, {MAX_GAMMA}], got {self.gamma}")
        if self.draft_deadline_ms is not None and not 0 < self.draft_deadline_ms <= MAX_DEADLINE_MS:
            raise InvalidParams(
                f"--draft-deadline-ms must be in (0, {MAX_DEADLINE_MS:.0f}], got {self.draft_deadline_ms}"
            )
        if not 0 <= self.wait_budget < 1:
            raise InvalidParams(f"--wait-budget must be in [0, 1), got {self.wait_budget}")
        if not 0 <= self.max_drafters <= MAX_DRAFTERS:
            raise InvalidParams(f"--max-drafters must be in [0, {MAX_DRAFTERS}], got {self.max_drafters}")
        if isinstance(self.batch_rows, bool) or not 0 <= self.batch_rows <= MAX_BATCH_ROWS:
            raise InvalidParams(f"--batch-rows must be in [0, {MAX_BATCH_ROWS}], got {self.batch_rows}")
        if isinstance(self.tree_nodes, bool) or not 0 <= self.tree_nodes <= MAX_TREE_NODES:
            raise InvalidParams(f"--tree-nodes must be in [0, {MAX_TREE_NODES}], got {self.tree_nodes}")
        if isinstance(self.max_jobs, bool) or not 1 <= self.max_jobs <= MAX_JOBS_LIMIT:
            raise InvalidParams(f"--max-jobs must be in [1, {MAX_JOBS_LIMIT}], got {self.max_jobs}")
        for name in ("http_body_timeout_s", "http_write_timeout_s", "http_idle_timeout_s", "http_read_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not 0 < value <= MAX_HTTP_TIMEOUT_S:
                raise InvalidParams(f"{name} must be in (0, {MAX_HTTP_TIMEOUT_S:.0f}] seconds, got {value}")
        if isinstance(self.drafter_price, bool) or not 0 <= self.drafter_price <= MAX_PRICE_WEI:
            raise InvalidParams(f"--drafter-price must be wei in [0, {MAX_PRICE_WEI}], got {self.drafter_price}")
        (
            parse_ether(self.escrow_deposit),
            parse_ether(self.escrow_floor),
            parse_ether(self.lane_deposit),
        )  # a clear error now, not at bonding
        if self.cheat is not Cheat.NONE and not self.chain:
            raise InvalidParams("--cheat only makes sense for a bonded node: add --chain RPC_URL")
        self.http_host_port  # validates --http  # noqa: B018

    @property
    def target_dir(self) -> Path:
        return get_pair(self.pair).target_dir(self.target_model)

    @property
    def draft_dir(self) -> Path:
        return get_pair(self.pair).draft_dir(self.draft_model)

    @property
    def http_limits(self) -> HttpLimits:
        return HttpLimits(
            self.http_body_timeout_s, self.http_write_timeout_s, self.http_idle_timeout_s, self.http_read_timeout_s
        )

    @property
    def http_host_port(self) -> tuple[str, int]:
        host, sep, port = self.http.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise InvalidParams(f"--http must be HOST:PORT (port 0 = any free port), got {self.http!r}")
        return host, int(port)

    @property
    def operator(self) -> OperatorConfig | None:
        """How the node bonds; None for an unbonded node (no receipts)."""
        if not self.chain:
            return None
        from node.chain.operator import OperatorConfig  # web3 and eth_account: only for a bonded node
        from node.chain.paymaster import PaymentConfig

        payments = PaymentConfig(
            self.drafter_price,
            parse_ether(self.escrow_deposit),
            parse_ether(self.escrow_floor),
            parse_ether(self.lane_deposit),
        )
        return OperatorConfig(
            rpc=self.chain,
            deployments_dir=Path(self.deployments),
            key_file=Path(self.operator_key or Path(self.data_dir) / "keys" / OPERATOR_KEY_FILE),
            bond_wei=parse_ether(self.bond) if self.bond is not None else None,
            cheat=self.cheat,
            new_store=self.new_receipt_store,
            payments=payments,
        )
