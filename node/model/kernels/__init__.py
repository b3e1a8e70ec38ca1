"""Linear-layer kernels for the target's forward pass: a speed choice that never changes what is sampled.

- ``plain``: the model's ``nn.Linear`` as loaded (torch's BLAS, MKL on x86).
- ``prepacked``: oneDNN's prepacked fp32 weights (``torch.utils.mkldnn.MkldnnLinear``).
- ``skinny``: our small-M fp32 kernel (``skinny_gemm.c``, AVX2 + FMA + F16C, one thread), compiled with the
  system C compiler on first use into ``.cache/kernels``. Each weight is read once per pass for any
  number of rows up to ``SKINNY_MAX_ROWS``, and a row's result does not depend on how many rows
  the pass has. Wider passes (a prompt's prefill) use torch's kernel. A matrix whose every weight
  is exactly a float16 value (the shipped SmolLM2 draft) is packed as float16 and widened in
  registers: the same products, bit for bit, for half the bytes read.

Every kernel is fp32: logits differ between kernels and pass shapes only by summation order, well
inside the tolerance band (docs/design.md §4); ``bench-target`` measures both the drift and the
speed, and docs/target-performance.md records the choice. Which kernel a model runs is chosen
where it is loaded (``node.model.loading.load_kernel``): the kernels know nothing of loading.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from node.model.pairs import CACHE_DIR
from verifier.errors import SpecmarketError
from verifier.proposal import MAX_GAMMA

log = logging.getLogger(__name__)

KERNELS = ("skinny", "plain", "prepacked")
DEFAULT_KERNEL = "skinny"
SOURCE = Path(__file__).with_name("skinny_gemm.c")
BUILD_DIR = CACHE_DIR / "kernels"
# no -ffast-math, and -std=c11 keeps FMA contraction off: the order of operations is the contract
CFLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-fPIC", "-shared", "-std=c11")
LIBS = ("-lm",)
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
WIDE_CPU_FLAGS = ("avx512f", "avx512dq", "avx512vl")  # the float16 product's AVX-512 path (same bits)
VNNI_CPU_FLAGS = (*WIDE_CPU_FLAGS, "avx512bw", "avx512_vnni")  # the 4-/5-bit draft product's (same bits)
ISA_ENV = "SPECMARKET_KERNEL_ISA"  # "avx2" keeps the AVX2 path on an AVX-512 machine (benchmarks, tests)
LANES = 8  # floats per AVX2 register: the kernel needs K to be a multiple
ROWS_PER_BLOCK = 4  # skinny_gemm.c's: weight rows per packed block (node.model.packed writes the same)
SKINNY_MAX_ROWS = MAX_GAMMA + 1  # the widest verification pass; wider inputs use torch's kernel
COMPILE_TIMEOUT_S = 120

_library: ctypes.CDLL | None = None


class KernelUnavailable(SpecmarketError):
    """The skinny kernel cannot run here (no C compiler, no AVX2/FMA/F16C, or a failed build)."""


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def cpu_summary() -> str:
    """The CPU's model name and which of the kernel's paths it has: how fast a verification pass of
    several rows can be depends on it (docs/target-performance.md)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = cpu_flags()
    paths = [name for name, flag in (("AVX-512", "avx512f"), ("AMX", "amx_tile")) if flag in flags]
    return f"{model} ({', '.join(paths) if paths else 'AVX2'})"


def _build(out: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc or gcc) on PATH to build the skinny kernel")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(f".{os.getpid()}.partial")
    cmd = [compiler, *CFLAGS, "-o", str(partial), str(SOURCE), *LIBS]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise KernelUnavailable(f"building {SOURCE.name} failed: {detail}") from exc
    partial.replace(out)  # atomic: a concurrent builder or a crash never leaves a half-written library


def library() -> ctypes.CDLL:
    """The compiled kernel, built once per source version (the file name carries its sha256)."""
    global _library
    if _library is not None:
        return _library
    missing = [f for f in REQUIRED_CPU_FLAGS if f not in cpu_flags()]
    if missing:
        raise KernelUnavailable(f"this CPU lacks {', '.join(missing)}, which the skinny kernel needs")
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    path = BUILD_DIR / f"skinny_gemm-{digest}.so"
    if not path.is_file():
        log.info("building the skinny kernel into %s", path)
        _build(path)
    lib = ctypes.CDLL(str(path))
    lib.skinny_pack.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.skinny_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3
    lib.skinny_gemm_f16.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3
    lib.skinny_gemm_i8.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3
    lib.skinny_gemm_i8_wide.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3
    lib.skinny_gemm_f16_wide.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3
    lib.skinny_rows_per_block.restype = ctypes.c_int
    for void in (lib.skinny_gemm, lib.skinny_gemm_f16, lib.skinny_gemm_i8, lib.skinny_gemm_i8_wide):
        void.restype = None  # (ctypes would read whatever the return register holds as an int)
    lib.skinny_gemm_f16_wide.restype = None
    for grouped in (lib.skinny_gemm_qg, lib.skinny_gemm_qg_vnni):
        grouped.argtypes, grouped.restype = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4, ctypes.c_int
    lib.skinny_rms_norm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_float]
    lib.skinny_rope.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 4 + [ctypes.c_void_p] * 2
    lib.skinny_attention.argtypes = (
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        + [ctypes.c_int] * 5
        + [ctypes.c_float, ctypes.c_void_p]
    )
    lib.skinny_tree_attention.argtypes = [*lib.skinny_attention.argtypes, ctypes.c_void_p, ctypes.c_void_p]
    lib.skinny_silu_mul.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int] * 2
    _library = lib
    return lib


def has_wide_path(flags: tuple[str, ...] = WIDE_CPU_FLAGS) -> bool:
    """Whether a product may take its AVX-512 path here (CPU ``flags``, unless ISA_ENV says avx2)."""
    return os.environ.get(ISA_ENV, "").lower() != "avx2" and all(f in cpu_flags() for f in flags)


def f16_gemm(lib: ctypes.CDLL):
    """The float16 product for this CPU: AVX-512 where it has it, else AVX2, bit-identical either way
    (skinny_gemm.c; tests/test_kernels.py checks it wherever both run)."""
    return lib.skinny_gemm_f16_wide if has_wide_path() else lib.skinny_gemm_f16


def i8_gemm(lib: ctypes.CDLL):
    """The int8 product (a draft's weights, unscaled) for this CPU, like ``f16_gemm``."""
    return lib.skinny_gemm_i8_wide if has_wide_path() else lib.skinny_gemm_i8


def group_gemm(lib: ctypes.CDLL):
    """The 4- or 5-bit product (a draft's weights, int8 activations; its last argument the bits) for
    this CPU: AVX512-VNNI where it has it, else AVX2, bit-identical either way. Returns non-zero when
    its scratch cannot be allocated."""
    return lib.skinny_gemm_qg_vnni if has_wide_path(VNNI_CPU_FLAGS) else lib.skinny_gemm_qg
