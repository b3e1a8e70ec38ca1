"""Time node/model/exact/exact.c's product paths (and exact_amx.c's), one thread, at the served
models' shapes.

Compiles exact.c (and exact_amx.c) into a temporary directory (the flags of tests/test_exact_kernel.py),
fills each matrix with fixed-seed random blocks (tests/test_exact_recipes.py's random_blocks) and
prints, for each type, shape, path and pass width, the median of --repeat runs in ms and the weight
bytes read per second (GB/s). The scalar reference is timed only where it is quick enough
(--ref-limit). Each --sources DIR (a saved copy of earlier kernel sources) is built too and timed in
the same run, its paths named DIR:path, so that a change is measured side by side with the code before.
The matrix stays in cache here: scripts/exact_bench_model_matrices.py streams a real GGUF's instead.

    .venv/bin/python scripts/bench_exact_kernel.py [--types Q4_K,Q6_K] [--rows 1,7,28,64] [--repeat 5] \
        [--paths vnni,amx] [--sources DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from test_exact_recipes import random_blocks  # noqa: E402

from node.model.exact.blocks import TYPES  # noqa: E402

SOURCE_DIR = ROOT / "node" / "model" / "exact"
CODES = {"Q8_0": 0, "Q5_0": 1, "Q4_K": 2, "Q6_K": 3}
VNNI = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
AMX = ("amx_tile", "amx_int8")
# (type, n, k, what): the 1.5B target's and the 0.5B draft's matrices
SHAPES = [
    ("Q4_K", 8960, 1536, "target ffn_gate/up"),
    ("Q4_K", 1536, 8960, "target ffn_down (Q4_K layers)"),
    ("Q6_K", 1536, 8960, "target ffn_down"),
    ("Q6_K", 151936, 1536, "target output head"),
    ("Q8_0", 151936, 896, "draft output head"),
    ("Q5_0", 4864, 896, "draft ffn_gate/up"),
    ("Q5_0", 896, 4864, "draft ffn_down"),
]
ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int] + [
    ctypes.c_void_p
] * 2


def cpu_flags() -> set[str]:
    line = next((s for s in Path("/proc/cpuinfo").read_text().splitlines() if s.startswith("flags")), ":")
    return set(line.split(":", 1)[1].split())


def build(tmp: Path, sources: Path, tag: str) -> tuple[ctypes.CDLL, list[str]]:
    if shutil.which("cc") is None:
        raise SystemExit("no C compiler")
    vnni = all(f in cpu_flags() for f in VNNI)
    amx = vnni and all(f in cpu_flags() for f in AMX) and (sources / "exact_amx.c").is_file()
    flags = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"] if vnni else []
    flags += ["-mamx-tile", "-mamx-int8"] if amx else []
    names = ("exact.c", "exact_vnni.c", "exact_amx.c", "exact_pack.c")
    files = [str(sources / name) for name in names if (sources / name).is_file()]
    out = tmp / f"{tag}.so"
    cmd = ["cc", "-O3", "-std=c11", "-ffp-contract=off", "-mavx2", *flags, "-fPIC", "-shared"]
    subprocess.run([*cmd, "-o", str(out), *files, "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.ex_scratch_bytes.restype, lib.ex_scratch_bytes.argtypes = ctypes.c_size_t, [ctypes.c_int] * 2
    paths = ["ref", "avx2"] + (["vnni"] if vnni else []) + (["amx"] if amx and lib.ex_amx_enable() == 0 else [])
    for path in paths:
        getattr(lib, f"ex_matmul_{path}").argtypes = ARGS
    if hasattr(lib, "ex_pack"):  # the products on matrices repacked at load (exact_pack.c)
        paths += [f"packed_{p}" for p in paths if p in ("vnni", "amx")]
        for path in paths:
            if path.startswith("packed_"):
                getattr(lib, f"ex_matmul_{path}").argtypes = [*ARGS[:7], ctypes.c_int, ctypes.c_void_p]
        lib.ex_packed_bytes.restype, lib.ex_packed_bytes.argtypes = ctypes.c_size_t, [ctypes.c_int] * 3
        lib.ex_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    return lib, paths


def median_ms(lib, path: str, code: int, raw: np.ndarray, n: int, k: int, x: np.ndarray, repeat: int) -> float:
    out = np.empty((x.shape[0], n), np.float32)
    scratch = np.empty(lib.ex_scratch_bytes(x.shape[0], k), np.uint8)
    fn = getattr(lib, f"ex_matmul_{path}")
    args = (code, raw.ctypes.data, n, k, x.ctypes.data, x.shape[0], out.ctypes.data, scratch.ctypes.data)
    if path.startswith("packed_"):
        size = lib.ex_packed_bytes(code, n, k)
        buf = np.empty(size + 64, np.uint8)
        packed = buf[-buf.ctypes.data % 64 :][:size]
        assert lib.ex_pack(code, raw.ctypes.data, n, k, packed.ctypes.data) == 0
        args = (code, packed.ctypes.data, n, k, x.ctypes.data, x.shape[0], out.ctypes.data, n, scratch.ctypes.data)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        assert fn(*args) == 0
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q5_0")
    parser.add_argument("--rows", default="1,7,28,64")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ref-limit", type=float, default=2e8, help="time the reference up to rows·n·k")
    parser.add_argument("--paths", help="only these paths (e.g. vnni,amx)")
    parser.add_argument("--sources", type=Path, action="append", default=[], help="earlier sources to time too")
    args = parser.parse_args()
    types, widths = args.types.split(","), [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(20261205)
    with tempfile.TemporaryDirectory() as tmp:
        runs = []  # (label, lib, path)
        for i, sources in enumerate([SOURCE_DIR, *args.sources]):
            lib, paths = build(Path(tmp), sources, f"lib{i}")
            label = "" if i == 0 else f"{sources.name}:"
            runs += [(label + p, lib, p) for p in paths if args.paths is None or p in args.paths.split(",")]
        header = " ".join(f"{label + ' ms':>14} {'GB/s':>6}" for label, _, _ in runs)
        print(f"{'type':5} {'n x k':>13} {'MB':>7} {'rows':>4} {header}")
        for name, n, k, what in SHAPES:
            if name not in types:
                continue
            raw = random_blocks(TYPES[name], n, k, rng)
            mb = raw.nbytes / 1e6
            print(f"# {name} {n}x{k}: {what}")
            for m in widths:
                x = (rng.standard_normal((m, k)) * 2).astype(np.float32)
                cells = []
                for _, lib, path in runs:
                    if path == "ref" and m * n * k > args.ref_limit:
                        cells.append(f"{'-':>14} {'-':>6}")
                        continue
                    ms = median_ms(lib, path, CODES[name], raw, n, k, x, 1 if path == "ref" else args.repeat)
                    cells.append(f"{ms:14.3f} {mb / ms:6.1f}")
                print(f"{name:5} {f'{n}x{k}':>13} {mb:7.1f} {m:4d} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
