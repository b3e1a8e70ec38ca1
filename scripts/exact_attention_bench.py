"""Time ops.c's ex_attention alone, a saved copy of earlier code against the tree's, side by side: both
are compiled here with the exact kernel's flags, called in turns on the same inputs (one thread), their
outputs compared bit for bit, and the median of each reported.

    .venv/bin/python scripts/exact_attention_bench.py --base /tmp/attn_base \
        [--rows 1,7,28,512] [--contexts 64,512,1024] [--repeat 7]

--base DIR holds the earlier ops.c. Rows are one pass's query rows (a chain) after a cache of the
context's length; the shape is Qwen2.5-Coder-1.5B's (12 query heads, 2 KV heads, heads of 128).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from node.model.exact import kernel  # noqa: E402
from node.model.kernels import cpu_flags  # noqa: E402

torch.set_num_threads(1)


def build(source: Path, out: Path) -> ctypes.CDLL:
    """ops.c alone, with the flags the served kernel gets on this CPU (AVX-512 where it has it)."""
    wide = all(f in cpu_flags() for f in kernel.VNNI_CPU_FLAGS)
    flags = kernel.BASE_FLAGS + (kernel.VNNI_FLAGS if wide else ())
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    subprocess.run([compiler, *flags, "-o", str(out), str(source), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    lib.ex_attention.argtypes = kernel.SIGNATURES["ex_attention"]
    lib.ex_attention.restype = None
    return lib


class Case:
    """One chain pass: ``rows`` query rows after ``context`` cached positions."""

    def __init__(self, rows: int, context: int, heads: int, kv_heads: int, head_dim: int) -> None:
        gen = torch.Generator().manual_seed(rows * 7919 + context)
        self.rows, self.start, self.heads, self.kv_heads, self.head_dim = rows, context, heads, kv_heads, head_dim
        stride = (heads + 2 * kv_heads) * head_dim  # the model's qkv rows: q, then k and v
        self.qkv = torch.randn(rows, stride, generator=gen)
        capacity = context + rows
        self.keys = torch.randn(kv_heads, capacity, head_dim, generator=gen)
        self.values = torch.randn(kv_heads, capacity, head_dim, generator=gen)
        self.scale = float(1.0 / head_dim**0.5)
        self.scratch = torch.empty(context + rows)

    def run(self, lib: ctypes.CDLL) -> torch.Tensor:
        out = torch.empty(self.rows, self.heads * self.head_dim)
        lib.ex_attention(
            self.qkv.data_ptr(), self.qkv.stride(0), self.keys.data_ptr(), self.values.data_ptr(),
            self.keys.shape[1], out.data_ptr(), self.rows, self.start, self.heads, self.kv_heads,
            self.head_dim, self.scale, self.scratch.data_ptr(), None, None,
        )  # fmt: skip
        return out


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, required=True, help="the folder of the earlier ops.c")
    parser.add_argument("--rows", default="1,7,28,512")
    parser.add_argument("--contexts", default="64,512,1024")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = build(args.base / "ops.c", Path(tmp) / "old.so")
        new = build(ROOT / "node/model/exact/ops.c", Path(tmp) / "new.so")
        print(f"{'rows':>5} {'context':>7} {'old ms':>9} {'new ms':>9} {'speedup':>7}  same bits")
        for rows in [int(r) for r in args.rows.split(",")]:
            for context in [int(c) for c in args.contexts.split(",")]:
                case = Case(rows, context, 12, 2, 128)
                same = torch.equal(case.run(old), case.run(new))
                t_old, t_new = [], []
                for _ in range(args.repeat):  # in turns, so that a busy machine slows both alike
                    t_old.append(timed(case.run, old))
                    t_new.append(timed(case.run, new))
                a, b = statistics.median(t_old) * 1e3, statistics.median(t_new) * 1e3
                print(f"{rows:>5} {context:>7} {a:>9.3f} {b:>9.3f} {a / b:>6.2f}x  {same}", flush=True)


if __name__ == "__main__":
    main()
