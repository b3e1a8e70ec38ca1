"""The skinny kernel (node/model/kernels): torch's product within float noise, bit-identical rows whatever
the pass width, the same tokens as torch's kernel on a real model, and a clear fallback where it
cannot be built."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import node.model.kernels as kernels
from node.model.kernels import SKINNY_MAX_ROWS, KernelUnavailable, library
from node.model.kernels.linear import SkinnyLinear
from node.model.loading import TINY_TARGET, load_kernel, load_model_dir
from verifier.tolerance import TOLERANCE_DELTA

SHAPES = [(1, 8), (5, 8), (13, 576), (576, 576), (1536, 576), (576, 1536), (4099, 64)]  # (N, K), ragged N too
ATOL = 1e-4  # fp32 summation-order noise on unit-scale inputs of width ≤ 1536 is ~1e-5


def _skinny(n: int, k: int, seed: int) -> tuple[torch.nn.Linear, SkinnyLinear]:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(k, n, bias=False)
    return linear, SkinnyLinear(linear, library())


@pytest.mark.parametrize("n,k", SHAPES)
def test_skinny_matches_torch_for_every_width_succeeds(n, k):
    linear, skinny = _skinny(n, k, seed=n + k)
    for rows in (1, 2, 3, 4, 5, 9, SKINNY_MAX_ROWS):
        x = torch.randn(1, rows, k)
        with torch.inference_mode():
            got, want = skinny(x), linear(x)
        assert got.shape == want.shape == (1, rows, n)
        assert float((got - want).abs().max()) < ATOL * max(1.0, k**0.5 / 8)


@pytest.mark.parametrize("n,k", SHAPES)
def test_skinny_rows_do_not_depend_on_the_pass_width_succeeds(n, k):
    """Row m of a pass over many rows is bit-identical to a pass over row m alone."""
    _, skinny = _skinny(n, k, seed=7)
    x = torch.randn(SKINNY_MAX_ROWS, k)
    with torch.inference_mode():
        together = skinny(x)
        for width in (2, 3, 5, SKINNY_MAX_ROWS):
            assert torch.equal(skinny(x[:width]), together[:width])
        alone = torch.cat([skinny(x[i : i + 1]) for i in range(SKINNY_MAX_ROWS)])
    assert torch.equal(alone, together)


@pytest.mark.skipif(not kernels.has_wide_path(), reason="this CPU has no AVX-512 (the AVX2 path is the only one)")
@pytest.mark.parametrize("dtype", ["f16", "i8"])
@pytest.mark.parametrize("n,k", [(5, 8), (13, 576), (2048, 1536), (4099, 64), (37, 8960)])
def test_wide_path_gives_the_avx2_paths_bits_succeeds(n, k, dtype):
    """The AVX-512 path of the float16 (and a draft's int8) product and its AVX2 path agree bit for
    bit, for every pass width up to and past a wide tile (12 rows): a referee on a machine without
    AVX-512 computes the same logits."""
    torch.manual_seed(n + k)
    weights = {"f16": lambda: torch.randn(n, k).half().float(), "i8": lambda: torch.randint(-127, 128, (n, k)).float()}
    weight = weights[dtype]()
    block = library().skinny_rows_per_block()
    packed = torch.empty(-(-n // block) * block * k)
    library().skinny_pack(weight.data_ptr(), packed.data_ptr(), n, k)
    packed = packed.half() if dtype == "f16" else packed.to(torch.int8)
    paths = (getattr(library(), f"skinny_gemm_{dtype}"), getattr(library(), f"skinny_gemm_{dtype}_wide"))
    for rows in (1, 2, 3, 5, 9, 12, 13, SKINNY_MAX_ROWS, 40):
        x = torch.randn(rows, k)
        outs = [torch.empty(rows, n), torch.empty(rows, n)]
        for fn, out in zip(paths, outs, strict=True):
            fn(x.data_ptr(), packed.data_ptr(), out.data_ptr(), rows, n, k)
        assert torch.equal(outs[0], outs[1]), rows
        scale = float(weight.abs().max())
        assert float((outs[1] - x @ weight.T).abs().max()) < ATOL * scale * max(1.0, k**0.5 / 8)


def test_isa_override_keeps_the_avx2_path_succeeds(monkeypatch):
    monkeypatch.setenv(kernels.ISA_ENV, "avx2")
    assert not kernels.has_wide_path()
    assert kernels.f16_gemm(library()) is library().skinny_gemm_f16


@pytest.mark.parametrize("n,k", [(5, 8), (576, 576), (4099, 64)])
def test_skinny_float16_weights_give_the_fp32_kernels_bits_succeeds(n, k):
    """A matrix of exact float16 values is packed as float16 (half the bytes) and every row of every
    width is bit-identical to the fp32-packed kernel on the same values."""
    torch.manual_seed(n)
    linear = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        linear.weight.copy_(linear.weight.half().float())
    half = SkinnyLinear(linear, library())
    assert half.half and half.packed.dtype == torch.float16
    with torch.no_grad():
        linear.weight[0, 0] += 1e-7  # one weight no longer exact in float16: fp32 packing
    full = SkinnyLinear(linear, library())
    assert not full.half and full.packed.dtype == torch.float32
    with torch.no_grad():
        linear.weight[0, 0] -= 1e-7
        full.packed.copy_(half.packed.float())  # the fp32 kernel on exactly the same values
    x = torch.randn(SKINNY_MAX_ROWS, k)
    with torch.inference_mode():
        for width in (1, 2, 3, 4, 5, SKINNY_MAX_ROWS):
            assert torch.equal(half(x[:width]), full(x[:width]))
        assert float((half(x) - linear(x)).abs().max()) < ATOL * max(1.0, k**0.5 / 8)


def test_rms_norm_matches_torch_and_rows_do_not_depend_on_the_pass_width_succeeds():
    from node.model.kernels.llama import RMSNorm

    torch.manual_seed(4)
    norm = torch.nn.RMSNorm(576, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    norm.variance_epsilon = norm.eps
    ours = RMSNorm.of(norm, library())
    x = 3 * torch.randn(SKINNY_MAX_ROWS, 576)
    with torch.inference_mode():
        want = torch.nn.functional.rms_norm(x, (576,), norm.weight, norm.eps)
        got = ours(x)
        assert float((got - want).abs().max()) < 1e-5
        assert torch.equal(torch.cat([ours(x[i : i + 1]) for i in range(SKINNY_MAX_ROWS)]), got)


def test_rope_is_bit_identical_to_torchs_rotate_half_succeeds():
    """The in-place kernel on the fused q|k rows equals HF's x·cos + rotate_half(x)·sin exactly."""
    rows, heads, head_dim, v_width = 5, 12, 64, 192
    torch.manual_seed(5)
    qkv = torch.randn(rows, heads * head_dim + v_width)
    cos, sin = torch.randn(rows, head_dim), torch.randn(rows, head_dim)
    x = qkv[:, : heads * head_dim].reshape(rows, heads, head_dim).transpose(0, 1)  # [heads, M, hd]
    half = head_dim // 2
    want = x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
    untouched = qkv[:, heads * head_dim :].clone()
    library().skinny_rope(qkv.data_ptr(), qkv.stride(0), rows, heads, head_dim, cos.data_ptr(), sin.data_ptr())
    assert torch.equal(qkv[:, : heads * head_dim].reshape(rows, heads, head_dim).transpose(0, 1), want)
    assert torch.equal(qkv[:, heads * head_dim :], untouched)  # v is not rotated


def test_skinny_wider_than_a_verification_pass_uses_torch_succeeds():
    linear, skinny = _skinny(64, 32, seed=3)
    x = torch.randn(SKINNY_MAX_ROWS + 1, 32)
    with torch.inference_mode():
        assert torch.equal(skinny(x), linear(x))


def test_skinny_on_gpt2_keeps_logits_in_the_band_and_tokens_the_same_succeeds():
    plain, _ = load_model_dir(TINY_TARGET, "target")
    skinny, _ = load_model_dir(TINY_TARGET, "target", kernel="skinny")
    assert skinny.kernel == "skinny"
    assert sum(isinstance(m, SkinnyLinear) for m in skinny.model.modules()) == 1  # GPT-2: only the LM head
    context = list(range(1, 65))
    plain.extend(context)
    skinny.extend(context)
    for block in ([7], [8, 9, 10, 11, 12]):
        want, got = plain.extend(block), skinny.extend(block)  # [len(block), V]
        assert float(np.abs(got - want).max()) < TOLERANCE_DELTA
        assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


def test_load_kernel_unknown_name_reverts():
    with pytest.raises(ValueError, match="unknown kernel"):
        load_kernel(torch.nn.Linear(8, 8), "m", "turbo")


def test_build_without_a_compiler_reverts(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(KernelUnavailable, match="failed"):
        kernels._build(tmp_path / "k.so")
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_skinny_falls_back_to_plain_where_it_cannot_run_succeeds(monkeypatch, caplog):
    """Without AVX2/FMA the node still serves, on torch's kernel, and says so."""
    monkeypatch.setattr(kernels, "_library", None)
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"sse2"})
    model, _ = load_model_dir(TINY_TARGET, "target")
    with caplog.at_level(logging.WARNING, logger="node.model.loading"):
        fallback = load_kernel(model.model, "target", "skinny")
    assert fallback.kernel == "plain" and not any(isinstance(m, SkinnyLinear) for m in fallback.model.modules())
    assert "lacks avx2, fma" in caplog.text and "plain" in caplog.text


@pytest.fixture(scope="module")
def small_llama():
    """A randomly initialised Llama (GQA, RoPE): the architecture of SmolLM2 at a size CI can afford."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=600,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def test_lean_forward_computes_the_hf_forward_succeeds(small_llama):
    from node.model.adapter import HFCausalLM
    from node.model.kernels.llama import INITIAL_CAPACITY, LeanLlamaLM

    lean = load_kernel(small_llama, "llama", "skinny")
    assert isinstance(lean, LeanLlamaLM) and lean.kernel == "skinny"
    hf = HFCausalLM(small_llama, "llama")
    rng = np.random.default_rng(1)
    steps = [list(rng.integers(300, size=40)), [5], [6, 7, 8, 9, 10], ("rollback", 4), [11, 12], [13]]
    steps += [list(rng.integers(300, size=n)) for n in (17, 3, 1)] * 12  # past INITIAL_CAPACITY: the cache grows
    for step in steps:
        if step[0] == "rollback":
            hf.rollback(step[1]), lean.rollback(step[1])
        else:
            want, got = hf.extend(step), lean.extend(step)  # [len(step), V]
            assert float(np.abs(want - got).max()) < 1e-4, f"step of {len(step)} at {len(hf.cached())}"
        assert list(lean.cached()) == list(hf.cached())
    assert len(lean.cached()) > INITIAL_CAPACITY


def test_lean_forward_rows_do_not_depend_on_the_pass_width_succeeds(small_llama):
    """Every step of the lean forward works row by row in a fixed order (products, norms, RoPE,
    attention), so a verification pass of any width returns, bit for bit, the logits that one-row
    passes would: the target's scores do not depend on how many draft tokens it verifies."""
    lean = load_kernel(small_llama, "llama", "skinny")
    rng = np.random.default_rng(2)
    prefix, block = list(rng.integers(300, size=30)), list(rng.integers(300, size=SKINNY_MAX_ROWS))
    one_by_one = lean.fork()
    one_by_one.extend(prefix)
    alone = np.concatenate([one_by_one.extend([t]) for t in block])
    for width in (2, 5, SKINNY_MAX_ROWS):
        wide = lean.fork()
        wide.extend(prefix)
        got = np.concatenate([wide.extend(block[i : i + width]) for i in range(0, len(block), width)])
        assert np.array_equal(got, alone), f"width {width}"


def test_lean_forks_share_weights_not_caches_succeeds(small_llama):
    lean = load_kernel(small_llama, "llama", "skinny")
    a, b = lean.fork(), lean.fork()
    first = a.extend([1, 2, 3])
    b.extend([9, 9, 9, 9])
    assert np.array_equal(a.fork().extend([1, 2, 3]), first)  # b's cache did not leak into a's weights
    assert b.weights is a.weights and list(a.cached()) == [1, 2, 3]


def test_no_prefix_is_cached_where_wide_passes_run_another_kernel_succeeds(small_llama):
    """The lean forward over HF weights runs passes wider than SKINNY_MAX_ROWS on torch's kernel, so
    a prompt's rows differ with the prefill's width: its jobs start from an empty cache."""
    from node.model.prefix_cache import PrefixCache

    cache = PrefixCache(load_kernel(small_llama, "llama", "skinny"))
    job = cache.fork_for([1, 2, 3])
    job.extend([1, 2, 3])
    cache.keep(job, 3)
    assert not job.shape_invariant and len(cache.fork_for([1, 2, 3, 4]).cached()) == 0


def test_lean_forward_past_the_context_window_reverts(small_llama):
    from verifier.errors import ContextTooLong

    lean = load_kernel(small_llama, "llama", "skinny")
    lean.extend(list(range(1, 300)) * 2)
    with pytest.raises(ContextTooLong, match="context window of 600"):
        lean.extend([1, 2, 3])
    assert len(lean.cached()) == 598  # nothing half-applied


def test_lean_forks_in_parallel_threads_match_one_at_a_time_succeeds(small_llama):
    """Jobs run in worker threads on shared weights: the rotary tables grow under them, their
    caches stay their own, and each gets what it would get alone."""
    from concurrent.futures import ThreadPoolExecutor

    lean = load_kernel(small_llama, "llama", "skinny")
    prompts = [list(np.random.default_rng(i).integers(300, size=280 + 40 * i)) for i in range(4)]

    def run(ids: list[int]) -> np.ndarray:
        model = lean.fork()
        model.extend(ids[:200])
        return np.concatenate([model.extend([t]) for t in ids[200:]])

    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(run, prompts))
    alone = [run(ids) for ids in prompts]
    assert all(np.array_equal(a, b) for a, b in zip(alone, together, strict=True))
