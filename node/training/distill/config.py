"""Every default of `specmarket train-draft` (the SmolLM2 draft's distillation), written once."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from node.model.pairs import MODELS_DIR, SMOLLM2_TARGET_DIR
from node.runtime.dirs import default_data_dir
from verifier.errors import InvalidParams

STAGES = ("labels", "train", "ship")


@dataclass(frozen=True)
class DistillConfig:
    target_dir: Path = SMOLLM2_TARGET_DIR
    teacher_dir: Path = field(default_factory=lambda: default_data_dir("training") / "teacher" / "smollm2")
    work_dir: Path = field(default_factory=lambda: default_data_dir("training") / "distill-smollm2")
    out_dir: Path = MODELS_DIR / "smollm2-draft"
    stages: tuple[str, ...] = STAGES
    layers: tuple[int, ...] = (0, 1)  # the target's decoder layers the draft starts from
    sub_vocab: int = 8192  # FR-Spec head size
    code_tokens: int = 1_000_000  # raw stdlib code the target labels
    chunk: int = 256  # tokens per code sequence
    top_k: int = 32  # target log-probs kept per position
    steps: int = 6000
    batch_sequences: int = 4  # sequences per optimiser step
    lr: float = 3e-4
    warmup: int = 100
    checkpoint_every: int = 100
    eval_temperature: float = 0.8
    eval_seeds: int = 4  # Gumbel draws per held-out position
    threads: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.stages) - set(STAGES)
        if unknown:
            raise InvalidParams(f"unknown stage(s) {sorted(unknown)}; choose from {', '.join(STAGES)}")
        if not self.layers or any(not 0 <= i < 30 for i in self.layers):
            raise InvalidParams(f"--layers must name decoder layers of the target (0-29), got {self.layers}")
        if not 256 <= self.sub_vocab <= 49152:
            raise InvalidParams(f"--sub-vocab must be in [256, 49152], got {self.sub_vocab}")
        if self.steps < 0 or self.batch_sequences < 1 or self.checkpoint_every < 1:
            raise InvalidParams("--steps must be >= 0, --batch-sequences and --checkpoint-every >= 1")
