"""The lab's configurations: every default of `demo-net`, `bench-local`, `bench-p2p` and
`bench-target`, written once (the CLI reads its defaults from these fields). The lab runs every
party on one named pair, by default the real one (DEFAULT_PAIR); importing this loads no model or
network stack."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from node.lab.workload import WORKLOADS, Workload
from node.model.kernels import KERNELS
from node.model.pairs import DEFAULT_PAIR, QWEN_DRAFT_DIR, QWEN_TARGET_DIR, get_pair
from verifier.proposal import DEFAULT_GAMMA

MAX_DEMO_TOKENS = 256  # the tiny target has a 512-position window; the prompts take a few dozen
QUICK_MAX_TOKENS = 16
QUICK_PROMPTS = 2
QUICK_FORGERY_SAMPLES = 1000


@dataclass(frozen=True)
class NetDemoConfig:
    out: Path = Path("demo_out") / "report"  # ignored; `make report` refreshes the committed report/
    max_tokens: int = 64  # per answer (the 1.5B pair: about 16 s of plain decoding each)
    prompts: tuple[str, ...] = ()  # default: the pair's workload (node.lab.workload)
    quick: bool = False  # CI: fewer prompts, tokens and forgery samples, same steps
    forgery_samples: int = 4000
    pair: str = DEFAULT_PAIR  # every party's model pair (node.model.pairs)

    def __post_init__(self) -> None:
        get_pair(self.pair)

    @property
    def workload(self) -> Workload:
        return WORKLOADS[self.pair]

    def effective(self) -> NetDemoConfig:
        prompts = self.prompts or self.workload.net_demo
        if not self.quick:
            return replace(self, prompts=prompts)
        tokens = min(self.max_tokens, QUICK_MAX_TOKENS)
        return replace(self, max_tokens=tokens, prompts=prompts[:QUICK_PROMPTS], forgery_samples=QUICK_FORGERY_SAMPLES)


@dataclass(frozen=True)
class BenchConfig:
    max_new_tokens: int = 64
    gamma: int = DEFAULT_GAMMA
    temperatures: tuple[float, ...] = (0.0, 1.0)
    repeats: int = 3  # interleaved repetitions; the median tok/s is reported
    out: Path = Path("bench_out/bench_local.json")
    pair: str = DEFAULT_PAIR  # node.model.pairs; the prompts are its workload's (node.lab.workload)


@dataclass(frozen=True)
class P2PBenchConfig:
    max_new_tokens: int = 64
    gamma: int = DEFAULT_GAMMA
    temperatures: tuple[float, ...] = (0.0, 1.0)
    repeats: int = 3  # interleaved repetitions; the median is reported
    draft_deadline_ms: float | None = None  # None: each target's own (node.target.config.auto_deadline_ms)
    out: Path = Path("bench_out/bench_p2p.json")
    pair: str = DEFAULT_PAIR  # node.model.pairs; the prompts are its workload's (node.lab.workload)


@dataclass(frozen=True)
class TargetBenchConfig:
    model_dir: Path = QWEN_TARGET_DIR  # any local model directory; default the default pair's target
    threads: tuple[int, ...] = (1, 2)
    kernels: tuple[str, ...] = KERNELS  # node.model.kernels
    max_gamma: int = 8
    repeats: int = 15  # passes per timing; the median is reported
    out: Path = Path("bench_out/bench_target.json")
    draft_dir: Path | None = QWEN_DRAFT_DIR  # its draft's ms per token is measured too (None: skipped)
