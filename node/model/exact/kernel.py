"""The exact arithmetic's C kernel (exact.c: the block products; exact_vnni.c: their AVX-512 VNNI path
for Q4_K and Q6_K; exact_amx.c: their AMX path for wide passes; exact_pack.c: those matrices repacked
once at load for both; ops.c: everything else), compiled with the system C compiler on first use into
``.cache/models/kernels``, and its products on the fastest path this CPU has for the pass's width (AMX
from ``AMX_MIN_ROWS`` rows, else AVX-512 VNNI, else AVX2: the same bits, tests/test_exact_kernel.py).

``SPECMARKET_KERNEL_ISA`` forces a path on a CPU that has more: ``avx2`` (no AVX-512), ``vnni`` (no
AMX), ``amx`` (AMX at every width, for tests and benchmarks).

Compiler rules of docs/exact-arithmetic.md §1: ``-ffp-contract=off`` (no FMA contraction), no
``-ffast-math``, so every binary32 operation is the specification's, in its order.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import mmap
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from node.model.exact.packed_store import open_packed
from node.model.kernels import BUILD_DIR, ISA_ENV, KernelUnavailable
from node.model.kernels import cpu_flags as read_cpu_flags
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

NAMES = ("exact.c", "exact_vnni.c", "exact_amx.c", "exact_pack.c", "ops.c")
SOURCES = tuple(Path(__file__).with_name(name) for name in NAMES)
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
PACKED_KINDS = ("Q4_K", "Q6_K")  # the formats exact_pack.c repacks (the VNNI and AMX paths read them so)
HUGE_PAGE = 2 << 20  # the packed weights' arena starts on a transparent huge page (fewer TLB misses)
EX_NON_FINITE, EX_BAD_SHAPE = 1, 2

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {
    "ex_matmul_ref": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_matmul_avx2": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_matmul_vnni": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_matmul_amx": [_I, _P, _I, _I, _P, _I, _P, _P],
    "ex_matmul_packed_vnni": [_I, _P, _I, _I, _P, _I, _P, _I, _P],
    "ex_matmul_packed_amx": [_I, _P, _I, _I, _P, _I, _P, _I, _P],
    "ex_rms_norm": [_P, _P, _P, _I, _I, _F],
    "ex_silu_mul": [_P, _P, _P, _I, _I, _I],
    "ex_rope": [_P, _I, _I, _I, _I, _P, _P],
    "ex_store_kv": [_P, _I, _I, _I, _I, _I, _P, _P, _I, _I],
    "ex_embed": [_I, _P, _I, _I, _P, _I, _P],
    "ex_attention": [_P, _I, _P, _P, _I, _P, _I, _I, _I, _I, _I, _F, _P, _P, _P],
    "ex_exp": [_P, _P, _I],
}

# built only with AVX-512 VNNI (the packed products) or AMX
OPTIONAL = ("ex_matmul_vnni", "ex_matmul_amx", "ex_matmul_packed_vnni", "ex_matmul_packed_amx")

_library: ctypes.CDLL | None = None
_amx: bool | None = None  # whether this process may use the tiles (probed once)


class ExactKernelError(SpecmarketError):
    """A product met a non-finite activation (an error under §3, never a result) or a bad shape."""


@functools.cache
def cpu_flags() -> frozenset[str]:
    """/proc/cpuinfo's flags, read once: every product asks which path runs (the file is long on a
    many-core server, and reading it was measured at 50 µs a call even on two cores)."""
    return frozenset(read_cpu_flags())


def _isa() -> str:
    return os.environ.get(ISA_ENV, "").lower()


@functools.cache
def _cpu_has_vnni() -> bool:
    return all(f in cpu_flags() for f in VNNI_CPU_FLAGS)


def has_vnni() -> bool:
    """Whether the VNNI path may run here (unless SPECMARKET_KERNEL_ISA=avx2 keeps AVX2)."""
    return _isa() != "avx2" and _cpu_has_vnni()


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
        if name in OPTIONAL and not hasattr(lib, name):
            continue  # built without AVX-512 or without AMX
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int if name.startswith(("ex_matmul", "ex_embed")) else None
    lib.ex_scratch_bytes.argtypes, lib.ex_scratch_bytes.restype = [_I, _I], ctypes.c_size_t
    if hasattr(lib, "ex_pack"):
        lib.ex_packed_bytes.argtypes, lib.ex_packed_bytes.restype = [_I, _I, _I], ctypes.c_size_t
        lib.ex_pack.argtypes, lib.ex_pack.restype = [_I, _P, _I, _I, _P], ctypes.c_int
        lib.ex_pack_check.argtypes, lib.ex_pack_check.restype = [_I, _P, _I, _I, _P], ctypes.c_int
    if hasattr(lib, "ex_amx_enable"):
        lib.ex_amx_enable.argtypes, lib.ex_amx_enable.restype = [], ctypes.c_int
    return lib


def product(lib: ctypes.CDLL, kind: str, rows: int):
    """The C product for ``rows`` rows of ``kind``: AMX for passes at least ``AMX_MIN_ROWS`` wide where
    it runs (any width under SPECMARKET_KERNEL_ISA=amx), else VNNI, else AVX2."""
    if has_amx(lib) and (rows >= AMX_MIN_ROWS.get(kind, 1 << 30) or _isa() == "amx"):
        return lib.ex_matmul_amx
    return lib.ex_matmul_vnni if has_vnni() and hasattr(lib, "ex_matmul_vnni") else lib.ex_matmul_avx2


def packed_product(lib: ctypes.CDLL, kind: str, rows: int):
    """The product on a packed copy of a ``kind`` matrix (exact_pack.c) for ``rows`` rows, as ``product``
    picks (AMX from ``AMX_MIN_ROWS``, else VNNI); None where neither runs (AVX2 reads the raw blocks)."""
    wide = rows >= AMX_MIN_ROWS.get(kind, 1 << 30) or _isa() == "amx"
    if wide and has_amx(lib) and hasattr(lib, "ex_matmul_packed_amx"):
        return lib.ex_matmul_packed_amx
    return lib.ex_matmul_packed_vnni if has_vnni() and hasattr(lib, "ex_matmul_packed_vnni") else None


def _check(rc: int, kind: str, k: int) -> None:
    if rc == EX_NON_FINITE:
        raise ExactKernelError("a non-finite activation reached a product (docs/exact-arithmetic.md §3)")
    if rc:
        raise ExactKernelError(f"{kind}: a product of width {k} does not fit its blocks (code {rc})")


def matmul(lib: ctypes.CDLL, kind: str, raw: int, n: int, k: int, x: torch.Tensor) -> torch.Tensor:
    """§3-4's product of ``x`` [M, k] binary32 with the GGUF matrix at address ``raw`` ([n, k] in
    ``kind``'s blocks) -> [M, n] binary32, on this CPU's fastest path."""
    x = x.contiguous()
    rows = x.shape[0]
    out = torch.empty(rows, n)
    scratch = torch.empty(lib.ex_scratch_bytes(rows, k), dtype=torch.uint8)
    rc = product(lib, kind, rows)(TYPE_CODES[kind], raw, n, k, x.data_ptr(), rows, out.data_ptr(), scratch.data_ptr())
    _check(rc, kind, k)
    return out


@dataclass(frozen=True)
class Part:
    """One matrix of a product: its format, its raw GGUF blocks' address, its packed copy's address (0:
    none), and its shape [n, k]."""

    kind: str
    raw: int
    packed: int
    n: int
    k: int


def matmul_parts(lib: ctypes.CDLL, parts: Sequence[Part], x: torch.Tensor) -> torch.Tensor:
    """``x`` [M, k] times each part, the outputs side by side -> [M, Σn]. Packed parts write their
    columns in place and quantize ``x`` once between them (the first prepares the scratch, the others
    reuse it); a part without a packed copy, or a path without packed products, takes ``matmul``."""
    x = x.contiguous()
    rows, k = x.shape[0], x.shape[1]
    total = sum(p.n for p in parts)
    fns = [packed_product(lib, p.kind, rows) if p.packed else None for p in parts]
    if len(parts) == 1 and fns[0] is None:
        return matmul(lib, parts[0].kind, parts[0].raw, parts[0].n, k, x)
    out = torch.empty(rows, total)
    scratch = torch.empty(lib.ex_scratch_bytes(rows, k), dtype=torch.uint8)
    column, prepared = 0, False
    for p, fn in zip(parts, fns, strict=True):
        if fn is None:
            out[:, column : column + p.n] = matmul(lib, p.kind, p.raw, p.n, k, x)  # a scratch of its own
        else:
            source = None if prepared else x.data_ptr()
            target = out.data_ptr() + 4 * column
            _check(fn(TYPE_CODES[p.kind], p.packed, p.n, k, source, rows, target, total, scratch.data_ptr()), p.kind, k)
            prepared = True
        column += p.n
    return out


class PackedArena:
    """The packed copies of a model's K-quant matrices (exact_pack.c's layout), in one anonymous mapping
    that asks for transparent huge pages: they replace the GGUF map's pages of those matrices, which are
    then never read. Empty where the kernel has no packed products (no AVX-512 VNNI, or
    SPECMARKET_KERNEL_ISA=avx2): those CPUs read the raw blocks."""

    def __init__(
        self, lib: ctypes.CDLL, matrices: Sequence[tuple[str, int, int, int, int]], directory: Path | None = None
    ) -> None:
        """``matrices``: (kind, raw address, n, k, raw bytes) each; ``directory``: where the packed copy is
        kept as a file that every process of the machine maps shared (packed_store.store_dir), else
        None: private."""
        self.addresses = [0] * len(matrices)
        if not (hasattr(lib, "ex_pack") and has_vnni()):
            return
        sizes = [lib.ex_packed_bytes(TYPE_CODES[m[0]], m[2], m[3]) if m[0] in PACKED_KINDS else 0 for m in matrices]
        if not sum(sizes):
            return
        coded = [(TYPE_CODES[kind], raw, n, k) for kind, raw, n, k, _ in matrices]
        shared = None if directory is None else open_packed(lib, directory, SOURCES, coded, sizes)
        if shared is not None:
            self._map, self.addresses = shared
            for (_, raw, _, _, raw_bytes), size in zip(matrices, sizes, strict=True):
                if size:
                    _drop_pages(raw, raw_bytes)
            return
        self._map = mmap.mmap(-1, sum(sizes) + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE)
        self._view = (ctypes.c_char * len(self._map)).from_buffer(self._map)
        at = -ctypes.addressof(self._view) % HUGE_PAGE + ctypes.addressof(self._view)
        for i, ((kind, raw, n, k, raw_bytes), size) in enumerate(zip(matrices, sizes, strict=True)):
            if size:
                if lib.ex_pack(TYPE_CODES[kind], raw, n, k, at):
                    raise ExactKernelError(f"{kind} [{n}, {k}] cannot be packed")
                self.addresses[i], at = at, at + size
                _drop_pages(raw, raw_bytes)


def _drop_pages(address: int, size: int) -> None:
    """The GGUF map's pages of [address, address + size) out of this process (MADV_DONTNEED; they were
    only read, so a later read, where a path wants the raw blocks, maps them from the file again): the
    packed copy replaces them rather than doubling the resident weights."""
    page = mmap.PAGESIZE
    start, stop = address + -address % page, (address + size) // page * page
    if stop > start and hasattr(mmap, "MADV_DONTNEED"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(stop - start), ctypes.c_int(mmap.MADV_DONTNEED))
