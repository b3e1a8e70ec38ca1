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
from node.target.config import TARGET_GAMMA
from verifier.errors import InvalidParams
from verifier.proposal import DEFAULT_GAMMA, MAX_GAMMA

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
    gamma: int = TARGET_GAMMA  # a round's most draft tokens: the targets', and the in-process drafter's
    prompts: int | None = None  # the first N of the pair's bench prompts (None: all)
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
    # an exact target (node.lab.bench_exact): issue 39's goals, beside llama.cpp on the same GGUF
    compare_dir: Path | None = None  # another target timed pass by pass beside it (e.g. the float16 one)
    llama: bool = True  # build (once) and run llama-bench on the same GGUF, same core, one thread
    llama_repeats: int = 3  # llama-bench -r
    prefill: int = 512  # the prompt prefilled from an empty cache (llama.cpp's pp at the same length)
    batch_jobs: int = 4  # jobs of 7 rows in the shared pass timed against one job's pass


@dataclass(frozen=True)
class AnchorBenchConfig:
    """`bench-anchor` (node.lab.bench_anchor): ours against llama.cpp, plain and speculative, one run."""

    pair: str = DEFAULT_PAIR  # its target must be exact (a GGUF served as published): the default pair's
    prompts: int = 4  # the first N of the pair's bench prompts
    max_tokens: int = 64  # every answer this long (end of sequence ignored on both sides)
    gamma: int = TARGET_GAMMA  # our target's γ and llama.cpp's --spec-draft-n-max
    repeats: int = 1  # passes over the prompts, modes taking turns prompt by prompt
    threads: tuple[int, ...] = (1, 2)  # llama.cpp's thread counts (1: pinned to the target's core)
    out: Path = Path("bench_out/bench_anchor.json")


@dataclass(frozen=True)
class DraftLengthConfig:
    """`bench-draft-length` (node.lab.draft_length): traces of the pair's bench prompts, replayed."""

    pair: str = DEFAULT_PAIR
    prompts: int = 8  # the first N of the pair's bench prompts
    seeds: int = 2  # answers per prompt, each its own seed
    max_tokens: int = 64
    temperature: float = 0.8  # the demo's
    gammas: tuple[int, ...] = (4, 5, 6, 8)
    thresholds: tuple[float, ...] = (0.0, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    transport_ms: float = 4.0  # one message's way over libp2p on loopback (the demo measures ~3 ms)
    out: Path = Path("bench_out/draft_length.json")
    replay: Path | None = None  # an earlier output: sweep its traces and costs again, decode nothing

    def __post_init__(self) -> None:
        get_pair(self.pair)
        if self.prompts < 1 or self.seeds < 1 or self.max_tokens < 2:
            raise InvalidParams("--prompts and --seeds must be >= 1, --max-tokens >= 2")
        if not all(1 <= g <= MAX_GAMMA for g in self.gammas):
            raise InvalidParams(f"every --gammas value must be in [1, {MAX_GAMMA}]")
        if not all(0.0 <= t < 1.0 for t in self.thresholds):
            raise InvalidParams("every --thresholds value must be in [0, 1)")
        if self.temperature < 0 or self.transport_ms < 0:
            raise InvalidParams("--temperature and --transport-ms must be >= 0")


@dataclass(frozen=True)
class LinkBenchConfig:
    """`specmarket bench-link` (node.lab.bench_link): plain `ask`, `ask --draft` and the market's
    drafters, through a link of each round trip."""

    pair: str = "qwen2.5-coder"
    rtts_ms: tuple[int, ...] = (0, 20, 50, 100)
    prompts: int = 3  # the first N code prompts (the libp2p protocol carries plain prompts)
    max_new_tokens: int = 64
    temperature: float = 0.0
    repeats: int = 1
    seed: int = 1
    out: Path | None = None
    wait_budget: float | None = None  # the targets' --wait-budget (None: their default; 0: never stop drafting)

    def __post_init__(self) -> None:
        get_pair(self.pair)
        if not self.rtts_ms or any(not 0 <= rtt <= 10_000 for rtt in self.rtts_ms):
            raise InvalidParams(f"--rtts must be round trips in [0, 10000] ms, got {self.rtts_ms}")
        if self.prompts < 1 or self.repeats < 1 or self.max_new_tokens < 1:
            raise InvalidParams("--prompts, --repeats and --max-new-tokens must be >= 1")
