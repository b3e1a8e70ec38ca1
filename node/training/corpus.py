"""Training corpus and tokenizer for the shipped model pair.

The corpus is the running interpreter's own standard library (``.py`` files only), split into
train and held-out sets *by file*, so held-out numbers measure generalisation to unseen files.
"""

from __future__ import annotations

import hashlib
import logging
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"
HELDOUT_EVERY = 40  # one file in ~40 (by path hash) is held out
MAX_FILE_BYTES = 400_000  # skip generated monsters (e.g. huge data tables)
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class CorpusSplit:
    train: tuple[Path, ...]
    heldout: tuple[Path, ...]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _is_heldout(rel: str) -> bool:
    digest = hashlib.sha256(rel.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_EVERY == 0


def split_corpus(root: Path | None = None) -> CorpusSplit:
    """Every readable ``.py`` file under ``root``, split deterministically by path hash."""
    root = root or stdlib_root()
    train: list[Path] = []
    heldout: list[Path] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _EXCLUDED_DIRS.intersection(rel.parts) or not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        (heldout if _is_heldout(rel.as_posix()) else train).append(path)
    return CorpusSplit(tuple(train), tuple(heldout))


def read_texts(paths: tuple[Path, ...]) -> Iterator[str]:
    for path in paths:
        try:
            yield path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError) as exc:
            log.debug("skipping %s: %s", path, exc)


def train_tokenizer(paths: tuple[Path, ...], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE (GPT-2 style) trained on ``paths``; returns a PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tok.train_from_iterator(read_texts(paths), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN)


def encode_files(tokenizer, paths: tuple[Path, ...]) -> np.ndarray:
    """Concatenate the token ids of every file, each followed by EOS, as uint16."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    chunks: list[np.ndarray] = []
    texts = list(read_texts(paths))
    batch = 256
    for i in range(0, len(texts), batch):
        for ids in tokenizer(texts[i : i + batch])["input_ids"]:
            chunks.append(np.asarray([*ids, eos], dtype=np.uint16))
    return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint16)
