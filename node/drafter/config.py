"""The drafter peer's configuration: every default of `specmarket drafter` is written here, once.

The CLI reads its defaults from these fields (``node.cli.options``); a ``[drafter]`` table of a
TOML file may override them, and command-line flags override both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from node.drafter.strategies import DEFAULT_SLOW_MS, STRATEGIES
from node.model.kernels import DEFAULT_KERNEL, KERNELS
from node.model.pairs import DEFAULT_PAIR, get_pair
from node.runtime.dirs import default_data_dir
from p2p.messages import DEFAULT_LISTEN
from verifier.errors import InvalidParams

MAX_THREADS = 256
# A draft block (one round's answer, or an early draft) ends at the first token the draft gives a
# probability below this, that token included (node.drafter.session). The winner of `specmarket
# bench-draft-length` on the qwen2.5-coder pair at T = 0.8, with the target's γ ≤ 6 (the optimum is
# flat: thresholds 0.7-0.9 at γ ≤ 6-8 are within 1%): docs/target-performance.md, "Draft length".
DEFAULT_MIN_CONFIDENCE = 0.8


@dataclass(frozen=True)
class DrafterConfig:
    """Every default of `specmarket drafter`, written once (the CLI reads them from here)."""

    bootstrap: str  # the target's multiaddr, ending in /p2p/<peer id>
    pair: str = DEFAULT_PAIR  # named target/draft pair (node.model.pairs): its draft is served
    model: Path | None = None  # draft model directory; default: the pair's draft
    strategy: str = "honest"
    data_dir: Path = field(default_factory=lambda: default_data_dir("drafter"))  # identity key
    listen: str = DEFAULT_LISTEN
    slow_ms: int = DEFAULT_SLOW_MS  # delay of the slow strategy
    seed: int = 0  # for the random strategy and flaky's drop point
    kernel: str = DEFAULT_KERNEL  # the draft's linear-layer kernel (node.model.kernels): speed only
    threads: int = 1  # torch threads: a small draft model gains nothing from more; leave cores to others
    overlap: bool = True  # draft the next block while the target verifies (early drafts); off: --no-overlap
    min_confidence: float = DEFAULT_MIN_CONFIDENCE  # a draft block ends at a token the draft is less sure of
    target_http: str | None = None  # the target's HTTP API: its /health says where it listens if it moved
    payout: str | None = None  # the address targets pay this drafter's vouchers to (None: unpaid)
    rpc: str | None = None  # a chain to check that operators' escrows cover their vouchers (None: no checks)
    key_file: Path | None = None  # the payout address's private key file: for `drafter redeem`, and --redeem-above
    # with --rpc and --key-file, redeem as soon as a target's unredeemed vouchers reach this many wei (0: after
    # every voucher), so an operator that empties its escrow takes at most about one job's pay; None: by hand
    redeem_above: int | None = None
    # the least price per accepted draft token a session may offer (an ``open`` below it is refused before any
    # work); None: 1 wei with a payout address (a drafter that asks to be paid drafts for nobody for free), else 0
    min_price: int | None = None

    @property
    def min_price_wei(self) -> int:
        if self.min_price is not None:
            return self.min_price
        return 1 if self.payout is not None else 0

    def __post_init__(self) -> None:
        get_pair(self.pair)
        if self.kernel not in KERNELS:
            raise InvalidParams(f"--kernel must be one of {', '.join(KERNELS)}, got {self.kernel!r}")
        if self.strategy not in STRATEGIES:
            raise InvalidParams(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.slow_ms < 0:
            raise InvalidParams(f"--slow-ms must be >= 0, got {self.slow_ms}")
        if not 0.0 <= self.min_confidence < 1.0:
            raise InvalidParams(f"--min-confidence must be in [0, 1), got {self.min_confidence}")
        if not 1 <= self.threads <= MAX_THREADS:
            raise InvalidParams(f"--threads must be in [1, {MAX_THREADS}], got {self.threads}")
        if self.target_http is not None and not self.target_http.startswith(("http://", "https://")):
            raise InvalidParams(f"--target-http must be an http:// or https:// URL, got {self.target_http!r}")
        if self.payout is not None and not re.fullmatch(r"0x[0-9a-fA-F]{40}", self.payout):
            raise InvalidParams(f"--payout must be an address (0x + 40 hex digits), got {self.payout!r}")
        if self.rpc is not None and not self.rpc.startswith(("http://", "https://")):
            raise InvalidParams(f"--rpc must be an http:// or https:// URL, got {self.rpc!r}")
        if self.redeem_above is not None and (self.redeem_above < 0 or not self.rpc or self.key_file is None):
            raise InvalidParams("--redeem-above needs --rpc and --key-file, and a number of wei >= 0")
        if self.min_price is not None and self.min_price < 0:
            raise InvalidParams(f"--min-price must be a number of wei >= 0, got {self.min_price}")
        from p2p.host import parse_peer_addr  # libp2p: only when a drafter is configured

        parse_peer_addr(self.bootstrap)  # fail at start, not on first dial

    @property
    def model_dir(self) -> Path:
        return get_pair(self.pair).draft_dir(self.model)
