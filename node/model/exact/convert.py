"""Making an exact model directory (docs/exact-arithmetic.md §11) from a published qwen2 GGUF.

The directory holds:
- ``model.gguf``: the GGUF as published (a hard link where the file system allows, else a copy);
- ``rope.bin``: §9's RoPE tables, cos [P, hd / 2] then sin, binary32 little-endian;
- ``config.json``: the model's shape from the GGUF's metadata, ``"arithmetic": "specmarket-exact/1"``
  and the names of those two files;
- the tokenizer (copied from ``tokenizer_from`` when given, else converted from the GGUF);
- ``specmarket_source.json``, written last: the GGUF's sha256 and the model hash receipts commit to.

Its model hash is the directory hash of every other file, so its preimage names the GGUF's sha256
(anyone can check it against the published file) and the arithmetic's version. Each step writes
into ``<out>.partial``, renamed into place at the end: a crash leaves no half-made directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from node.model.exact import ARITHMETIC_KEY, ARITHMETIC_VERSION
from node.model.exact.model import FILES_KEY
from node.model.exact.reference import rope_tables
from node.model.gguf_config import gguf_config
from node.model.pairs import CONVERTED_MARKER

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.gguf"
ROPE_FILE = "rope.bin"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def exact_config(reader) -> dict:
    """config.json of an exact directory: the qwen2 shape of ``reader`` (a GGUFReader)."""
    cfg = gguf_config(reader)
    for packed_only in ("torch_dtype", "specmarket_packed"):
        cfg.pop(packed_only, None)
    cfg[ARITHMETIC_KEY] = ARITHMETIC_VERSION
    cfg[FILES_KEY] = {"weights": WEIGHTS_FILE, "rope": ROPE_FILE}
    return cfg


def _link_or_copy(source: Path, dest: Path) -> None:
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def _tokenizer(gguf: Path, tokenizer_from: Path | None, out: Path) -> None:
    if tokenizer_from is not None and (tokenizer_from / "tokenizer.json").is_file():
        for name in TOKENIZER_FILES:
            if (tokenizer_from / name).is_file():
                shutil.copyfile(tokenizer_from / name, out / name)
        return
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def write_exact(gguf: Path, gguf_sha256: str, out_dir: Path, tokenizer_from: Path | None = None) -> Path:
    """Make the exact directory ``out_dir`` of ``gguf`` (whose sha256 the caller has checked)."""
    from gguf import GGUFReader

    from node.model.loading import model_hash

    log.info("making the exact model %s from %s", out_dir, gguf.name)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = exact_config(GGUFReader(gguf))
    _link_or_copy(gguf, tmp / WEIGHTS_FILE)
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    cos, sin = rope_tables(cfg["rope_theta"], head_dim, cfg["max_position_embeddings"])
    with open(tmp / ROPE_FILE, "wb") as f:
        f.write(cos.astype("<f4").tobytes())
        f.write(sin.astype("<f4").tobytes())
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    _tokenizer(gguf, tokenizer_from, tmp)
    record = {"gguf": gguf.name, "gguf_sha256": gguf_sha256, "arithmetic": ARITHMETIC_VERSION,
              "model_hash": model_hash(tmp).hex()}  # fmt: skip
    (tmp / CONVERTED_MARKER).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return out_dir
