"""Time exact.c's products on a real GGUF's matrices the way a pass meets them: each tensor of a kind
(ffn_gate and ffn_up, ffn_down, attn_q ..., the output head) one after the other, so that the
weights stream from memory as in a forward pass, not from cache as in scripts/bench_exact_kernel.py.

    .venv/bin/python scripts/exact_bench_model_matrices.py --gguf .cache/models/.../model.gguf \
        [--rows 1,7,28,64] [--sources DIR ...] [--paths vnni,packed,amx,packed_amx] [--repeat 3]

Each --sources DIR (a saved copy of exact.c, e.g. the code before a change) is built and timed in
the same run, side by side; the numbers are ms per product (the median over the tensors and repeats).
The paths packed and packed_amx time the products on the matrices repacked as the model does at load
(exact_pack.c: ex_pack once per tensor, outside the timing), the others read the GGUF's blocks.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node.model.kernels import cpu_flags  # noqa: E402

CODES = {"Q8_0": 0, "Q5_0": 1, "Q4_K": 2, "Q6_K": 3}
ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int] + [
    ctypes.c_void_p
] * 2
GROUPS = {
    "gate/up": ("ffn_gate.weight", "ffn_up.weight"),
    "down": ("ffn_down.weight",),
    "q/o": ("attn_q.weight", "attn_output.weight"),
    "head": ("output.weight",),  # the name itself (attn_output.weight is q/o's)
}


def matches(name: str, suffixes: tuple[str, ...]) -> bool:
    return any(name == s or name.endswith("." + s) for s in suffixes)


def build(sources: Path, tmp: Path, tag: str) -> ctypes.CDLL:
    flags = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"] if "avx512_vnni" in cpu_flags() else []
    if "amx_int8" in cpu_flags() and (sources / "exact_amx.c").is_file():
        flags += ["-mamx-tile", "-mamx-int8"]
    files = [str(p) for p in sorted(sources.glob("exact*.c"))]
    out = tmp / f"{tag}.so"
    cmd = ["cc", "-O3", "-std=c11", "-ffp-contract=off", "-mavx2", *flags, "-fPIC", "-shared", "-o", str(out)]
    subprocess.run([*cmd, *files, "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.ex_scratch_bytes.restype, lib.ex_scratch_bytes.argtypes = ctypes.c_size_t, [ctypes.c_int] * 2
    if hasattr(lib, "ex_pack"):
        lib.ex_packed_bytes.restype, lib.ex_packed_bytes.argtypes = ctypes.c_size_t, [ctypes.c_int] * 3
        lib.ex_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    if hasattr(lib, "ex_amx_enable") and lib.ex_amx_enable() != 0:
        raise SystemExit("Linux refused the AMX tile state")
    return lib


def pack(lib: ctypes.CDLL, tensor) -> np.ndarray:
    """The tensor in exact_pack.c's layout, in memory like the model's arena's"""
    code, n, k = CODES[tensor.tensor_type.name], int(tensor.shape[1]), int(tensor.shape[0])
    size = lib.ex_packed_bytes(code, n, k)
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # page-aligned
    area.madvise(mmap.MADV_HUGEPAGE)  # as kernel.PackedArena's (streams through 4 KB pages miss the TLB)
    out = np.frombuffer(area, np.uint8)
    assert lib.ex_pack(code, tensor.data.ctypes.data, n, k, out.ctypes.data) == 0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--rows", default="1,7,28,64")
    parser.add_argument("--sources", type=Path, action="append", default=[])
    parser.add_argument("--paths", default="vnni")
    parser.add_argument("--groups", default=",".join(GROUPS))
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from gguf import GGUFReader

    reader = GGUFReader(args.gguf)
    sources = args.sources or [ROOT / "node" / "model" / "exact"]
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        libs = [(str(s), build(s, Path(tmp), f"lib{i}")) for i, s in enumerate(sources)]
        for group in args.groups.split(","):
            tensors = [t for t in reader.tensors if t.tensor_type.name in CODES and matches(t.name, GROUPS[group])]
            for rows in [int(r) for r in args.rows.split(",")]:
                k = int(tensors[0].shape[0])
                x = (rng.standard_normal((rows, k)) * 2).astype(np.float32)
                cells = []
                for label, lib in libs:
                    for path in args.paths.split(","):
                        fn = getattr(lib, f"ex_matmul_{path}", None)
                        if fn is None:
                            continue
                        packed = path.startswith("packed")
                        fn.argtypes = [*ARGS[:7], ctypes.c_int, ctypes.c_void_p] if packed else ARGS
                        copies = {t.name: pack(lib, t) for t in tensors} if packed else {}
                        times = []
                        for rep in range(args.repeat + 1):  # the first touches the map's pages
                            for t in tensors:
                                n, kk = int(t.shape[1]), int(t.shape[0])
                                xx = x if kk == k else (rng.standard_normal((rows, kk)) * 2).astype(np.float32)
                                out = np.empty((rows, n), np.float32)
                                scratch = np.empty(lib.ex_scratch_bytes(rows, kk), np.uint8)
                                w = copies[t.name].ctypes.data if packed else t.data.ctypes.data
                                tail = (n, scratch.ctypes.data) if packed else (scratch.ctypes.data,)
                                start = time.perf_counter()
                                code = CODES[t.tensor_type.name]
                                rc = fn(code, w, n, kk, xx.ctypes.data, rows, out.ctypes.data, *tail)
                                if rep:
                                    times.append(time.perf_counter() - start)
                                assert rc == 0
                        cells.append(f"{Path(label).name}:{path} {statistics.median(times) * 1e3:7.3f}")
                print(f"{group:8} rows {rows:3d}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
