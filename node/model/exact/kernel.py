"""The exact arithmetic's C kernel (exact.c: the block products; exact_vnni.c: their AVX-512 VNNI path
for Q4_K and Q6_K; exact_amx.c: their AMX path for wide passes; ops.c: everything else), compiled with
the system C compiler on first use into ``.cache/models/kernels``, and its products on the fastest path
this CPU has for the pass's width (AMX from ``AMX_MIN_ROWS`` rows, else AVX-512 VNNI, else AVX2: the
same bits, tests/test_exact_kernel.py).

``SPECMARKET_KERNEL_ISA`` forces a path on a CPU that has more: ``avx2`` (no AVX-512), ``vnni`` (no
AMX), ``amx`` (AMX at every width, for tests and benchmarks).

Compiler rules of docs/exact-arithmetic.md §1: ``-ffp-contract=off`` (no FMA contraction), no
``-ffast-math``, so every binary32 operation is the specification's, in its order.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from node.model.kernels import BUILD_DIR, ISA_ENV, KernelUnavailable, cpu_flags
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("exact.c", "exact_vnni.c", "exact_amx.c", "ops.c"))
BASE_FLAGS = ("-O3", "-std=c11", "-ffp-contract=off", "-mavx2", "-fPIC", "-shared")
VNNI_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
VNNI_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
AMX_FLAGS = ("-mamx-tile", "-mamx-int8")
AMX_CPU_FLAGS = ("amx_tile", "amx_int8")
# the narrowest pass each format's AMX path is faster for (one thread, Sapphire Rapids, weights streaming
# from memory: scripts/exact_bench_model_matrices.py); narrower passes and other formats take VNNI
AMX_MIN_ROWS = {"Q4_K": 16, "Q6_K": 16}
PROBE_TIMEOUT_S = 30
COMPILE_TIMEOUT_S = 120
TYPE_CODES = {"Q8_0": 0, "Q5_0": 1, "Q4_K": 2, "Q6_K": 3}  # exact.c's EX_* codes
EX_NON_FINITE, EX_BAD_SHAPE = 1, 2

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {
    "ex_matmul_ref": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_matmul_avx2": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_matmul_vnni": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_matmul_amx": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_rms_norm": [_P, _P, _P, _I, _I, _F],
    "ex_silu_mul": [_P, _P, _P, _I, _I, _I],
    "ex_rope": [_P, _I, _I, _I, _I, _P, _P],
    "ex_attention": [_P, _I, _P, _P, _I, _P, _I, _I, _I, _I, _I, _F, _P, _P, _P],
    "ex_exp": [_P, _P, _I],
}

_library: ctypes.CDLL | None = None
_amx: bool | None = None  # whether this process may use the tiles (probed once)


class ExactKernelError(SpecmarketError):
    """A product met a non-finite activation (an error under §3, never a result) or a bad shape."""


def _isa() -> str:
    return os.environ.get(ISA_ENV, "").lower()


def has_vnni() -> bool:
    """Whether the VNNI path may run here (unless SPECMARKET_KERNEL_ISA=avx2 keeps AVX2)."""
    flags = cpu_flags()
    return _isa() != "avx2" and all(f in flags for f in VNNI_CPU_FLAGS)


def _cpu_has_amx() -> bool:
    flags = cpu_flags()
    return all(f in flags for f in VNNI_CPU_FLAGS + AMX_CPU_FLAGS)


def amx_probe(path: Path) -> bool:
    """Whether the library at ``path`` can run a tile product here: Linux grants the tile state
    (arch_prctl) and a known product comes out right, tried in a child process, so that a CPU or kernel
    that refuses cannot take this process down with it."""
    code = f"import ctypes, sys; sys.exit(ctypes.CDLL({str(path)!r}).ex_amx_probe())"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def has_amx(lib: ctypes.CDLL) -> bool:
    """Whether ``lib``'s AMX path may run in this process (probed once, then the tile state asked for)."""
    global _amx
    if _isa() in ("avx2", "vnni") or not hasattr(lib, "ex_matmul_amx"):
        return False
    if _amx is None:
        _amx = amx_probe(Path(lib._name)) and lib.ex_amx_enable() == 0
        if not _amx:
            log.warning("this CPU lists AMX but its tiles cannot be used here: the exact kernel runs VNNI")
    return _amx


def _flags() -> tuple[str, ...]:
    wide = all(f in cpu_flags() for f in VNNI_CPU_FLAGS)
    return BASE_FLAGS + (VNNI_FLAGS if wide else ()) + (AMX_FLAGS if _cpu_has_amx() else ())


def _build(out: Path, flags: tuple[str, ...]) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise KernelUnavailable("no C compiler (cc or gcc) on PATH to build the exact kernel")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(f".{os.getpid()}.partial")
    cmd = [compiler, *flags, "-o", str(partial), *map(str, SOURCES), "-lm"]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailable(f"building the exact kernel failed: {getattr(exc, 'stderr', '') or exc}") from exc
    partial.replace(out)  # atomic: a concurrent builder or a crash never leaves a half-written library


def library() -> ctypes.CDLL:
    """The compiled kernel for this CPU (AVX2, and AVX-512 VNNI where it has it), built once."""
    global _library
    if _library is None:
        if "avx2" not in cpu_flags():
            raise KernelUnavailable("this CPU lacks AVX2, which the exact kernel needs")
        _library = compiled(_flags())
    return _library


def compiled(flags: tuple[str, ...]) -> ctypes.CDLL:
    """The kernel built with ``flags`` (once per source and flag set: the file name carries their
    sha256). Every flag set computes the same bits; ``BASE_FLAGS`` alone is the AVX2-only build."""
    digest = hashlib.sha256(b"".join(s.read_bytes() for s in SOURCES) + " ".join(flags).encode()).hexdigest()[:16]
    path = BUILD_DIR / f"exact-{digest}.so"
    if not path.is_file():
        log.info("building the exact kernel into %s", path)
        _build(path, flags)
    lib = ctypes.CDLL(str(path))
    for name, argtypes in SIGNATURES.items():
        if name in ("ex_matmul_vnni", "ex_matmul_amx") and not hasattr(lib, name):
            continue  # built without AVX-512 or without AMX
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int if name.startswith("ex_matmul") else None
    lib.ex_scratch_bytes.argtypes, lib.ex_scratch_bytes.restype = [_I, _I], ctypes.c_size_t
    if hasattr(lib, "ex_amx_enable"):
        lib.ex_amx_enable.argtypes, lib.ex_amx_enable.restype = [], ctypes.c_int
    return lib


def product(lib: ctypes.CDLL, kind: str, rows: int):
    """The C product for ``rows`` rows of ``kind``: AMX for passes at least ``AMX_MIN_ROWS`` wide where
    it runs (any width under SPECMARKET_KERNEL_ISA=amx), else VNNI, else AVX2."""
    if has_amx(lib) and (rows >= AMX_MIN_ROWS.get(kind, 1 << 30) or _isa() == "amx"):
        return lib.ex_matmul_amx
    return lib.ex_matmul_vnni if has_vnni() and hasattr(lib, "ex_matmul_vnni") else lib.ex_matmul_avx2


def matmul(lib: ctypes.CDLL, kind: str, raw: int, n: int, k: int, x: torch.Tensor) -> torch.Tensor:
    """§3-4's product of ``x`` [M, k] binary32 with the GGUF matrix at address ``raw`` ([n, k] in
    ``kind``'s blocks) -> [M, n] binary32, on this CPU's fastest path."""
    x = x.contiguous()
    rows = x.shape[0]
    out = torch.empty(rows, n)
    scratch = torch.empty(lib.ex_scratch_bytes(rows, k), dtype=torch.uint8)
    rc = product(lib, kind, rows)(TYPE_CODES[kind], raw, n, k, x.data_ptr(), rows, out.data_ptr(), scratch.data_ptr())
    if rc == EX_NON_FINITE:
        raise ExactKernelError("a non-finite activation reached a product (docs/exact-arithmetic.md §3)")
    if rc:
        raise ExactKernelError(f"{kind}: a product of width {k} does not fit its blocks (code {rc})")
    return out
