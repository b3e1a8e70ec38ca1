"""Named model pairs and the real target's preparation: the default set-up converts once, a second
run does not convert again, and a missing or damaged model is a clear error naming the set-up."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from node.model.loading import ModelLoadError, load_model_dir, model_hash
from node.model.pairs import (
    CONVERTED_MARKER,
    SETUP_COMMAND,
    SMOLLM2_TARGET_DIR,
    ModelNotPrepared,
    check_prepared,
    get_pair,
)
from node.training.smollm2 import GGUF_SHA256, is_converted
from verifier.errors import InvalidParams

TINY = get_pair("tiny")


def _copy_with_record(tmp_path: Path) -> Path:
    """A copy of the tiny target with a conversion record, as `prepare-target` writes one."""
    out = tmp_path / "converted"
    shutil.copytree(TINY.target, out)
    record = {"gguf_sha256": GGUF_SHA256, "model_hash": model_hash(out).hex()}
    (out / CONVERTED_MARKER).write_text(json.dumps(record))
    return out


def test_unknown_pair_names_the_choices():
    with pytest.raises(InvalidParams, match="smollm2, tiny"):
        get_pair("gpt-5")


def test_an_unprepared_target_names_the_setup_command(tmp_path):
    with pytest.raises(ModelNotPrepared, match=SETUP_COMMAND):
        check_prepared(tmp_path / "nowhere")
    (tmp_path / CONVERTED_MARKER).write_text("{not json")
    with pytest.raises(ModelNotPrepared, match="unreadable"):
        check_prepared(tmp_path)


def test_the_record_is_not_part_of_the_model_hash(tmp_path):
    out = _copy_with_record(tmp_path)
    assert model_hash(out) == model_hash(TINY.target)


def test_an_intact_conversion_is_not_done_again_and_a_damaged_one_is(tmp_path):
    out = _copy_with_record(tmp_path)
    assert is_converted(out, GGUF_SHA256)
    assert not is_converted(out, "0" * 64)  # another GGUF: convert again
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")  # one byte changed
    assert not is_converted(out, GGUF_SHA256)


def test_a_truncated_model_is_a_load_error_not_a_traceback(tmp_path):
    out = _copy_with_record(tmp_path)
    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match="cannot load target model"):
        load_model_dir(out, "target")
    cli = subprocess.run(
        [sys.executable, "-m", "node", "generate", "--prompt", "x", "--target-model", str(out), "--drafter", "none"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 2, cli.stderr
    assert cli.stderr.startswith("specmarket: error: cannot load target model")
    assert "Traceback" not in cli.stderr


def test_the_prepared_real_target_is_intact():
    """`make setup` converted SmolLM2-135M-Instruct; its files still hash to the recorded commitment."""
    record = check_prepared(SMOLLM2_TARGET_DIR)
    assert record["gguf_sha256"] == GGUF_SHA256
    assert model_hash(SMOLLM2_TARGET_DIR).hex() == record["model_hash"]
    config = json.loads((SMOLLM2_TARGET_DIR / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
