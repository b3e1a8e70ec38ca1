"""The lab's configurations: every default of `demo-net`, `bench-local` and `bench-p2p`, written
once (the CLI reads its defaults from these fields). Importing it loads no model or network stack."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from market.policy import DEFAULT_DEADLINE_MS
from node.kernels import KERNELS
from node.lab.workload import NET_DEMO_PROMPTS
from node.pairs import SMOLLM2_TARGET_DIR
from verifier.proposal import DEFAULT_GAMMA

# The lab (demo-net, the benchmarks and their child processes) runs on the tiny pair until the
# demo moves to SmolLM2 (planned, docs/design.md §8); every role's own default is DEFAULT_PAIR.
LAB_PAIR = "tiny"
MAX_DEMO_TOKENS = 256  # the shipped target has a 512-position window; the prompts take a few dozen
QUICK_MAX_TOKENS = 16
QUICK_PROMPTS = 2
QUICK_FORGERY_SAMPLES = 1000


@dataclass(frozen=True)
class NetDemoConfig:
    out: Path = Path("demo_out") / "report"  # ignored; `make report` refreshes the committed report/
    max_tokens: int = 48
    prompts: tuple[str, ...] = NET_DEMO_PROMPTS
    quick: bool = False  # CI: fewer prompts, tokens and forgery samples, same steps
    forgery_samples: int = 4000

    def effective(self) -> NetDemoConfig:
        if not self.quick:
            return self
        return NetDemoConfig(
            self.out, min(self.max_tokens, QUICK_MAX_TOKENS), self.prompts[:QUICK_PROMPTS], True, QUICK_FORGERY_SAMPLES
        )


@dataclass(frozen=True)
class BenchConfig:
    max_new_tokens: int = 64
    gamma: int = DEFAULT_GAMMA
    temperatures: tuple[float, ...] = (0.0, 1.0)
    repeats: int = 3  # interleaved repetitions; the median tok/s is reported
    out: Path = Path("bench_out/bench_local.json")


@dataclass(frozen=True)
class P2PBenchConfig:
    max_new_tokens: int = 64
    gamma: int = DEFAULT_GAMMA
    temperatures: tuple[float, ...] = (0.0, 1.0)
    repeats: int = 3  # interleaved repetitions; the median is reported
    draft_deadline_ms: float = DEFAULT_DEADLINE_MS
    out: Path = Path("bench_out/bench_p2p.json")


@dataclass(frozen=True)
class TargetBenchConfig:
    model_dir: Path = SMOLLM2_TARGET_DIR  # any local HF causal-LM directory; default the converted SmolLM2-135M
    threads: tuple[int, ...] = (1, 2)
    kernels: tuple[str, ...] = KERNELS  # node.kernels
    max_gamma: int = 8
    repeats: int = 15  # passes per timing; the median is reported
    out: Path = Path("bench_out/bench_target.json")
