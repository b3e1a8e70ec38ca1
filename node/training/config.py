"""`specmarket train`'s configuration, written once (the CLI reads its defaults from it); importing
it loads no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from node.runtime.dirs import default_data_dir


@dataclass(frozen=True)
class PipelineConfig:
    out_dir: Path = field(default_factory=lambda: default_data_dir("training") / "models")  # models/ to replace
    work_dir: Path = field(default_factory=lambda: default_data_dir("training") / "work")  # stage checkpoints
    target_steps: int = 1300
    draft_steps: int = 600
    batch_size: int = 8
    threads: int = 2
