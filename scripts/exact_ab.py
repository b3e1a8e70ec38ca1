"""Before and after, side by side: the whole exact model from two source trees (e.g. `git archive HEAD`
unpacked into /tmp/before, and this checkout), each loaded once in a worker process of its own; the
driver has them take turns measurement by measurement (which goes first alternates), so load that comes
and goes on the machine falls on both alike. Everything runs on one core (--cpu) and one thread.

    .venv/bin/python scripts/exact_ab.py --before /tmp/before --after . [--rows 1,7,28] [--repeat 9] \
        [--batch 4x7] [--prefill 512] [--prefill-repeat 3] [--cpu 1]

t(R): one R-row pass after a COST_CONTEXT-token context (as `specmarket bench-target`); batch JxR: one
shared pass of J jobs × R rows (node.model.kernels.batch); prefill N: an N-token prompt from an empty
cache. Medians (and minima) in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache/models/qwen2.5-coder-1.5b-instruct-exact"
COST_CONTEXT = 64  # node/lab/bench_local.py's


def worker(root: Path, model_dir: Path) -> None:
    """Load the model from ``root``'s sources, then answer "pass R", "batch J R" and "prefill N" lines
    with the ms each took."""
    sys.path.insert(0, str(root))
    import torch

    from node.model.exact import kernel, model
    from node.model.kernels.batch import extend_batch

    torch.set_num_threads(1)
    started = time.perf_counter()
    cfg = json.loads((model_dir / "config.json").read_text())
    lm = model.load_exact_lm(model_dir, cfg, "ab", kernel.library())
    print(f"loaded {time.perf_counter() - started:.2f}", flush=True)
    lm.extend(list(range(1, COST_CONTEXT + 1)))
    jobs: list = []
    for line in sys.stdin:
        op, *args = line.split()
        numbers = [int(a) for a in args]
        if op == "batch" and len(jobs) != numbers[0]:
            jobs = [lm.fork() for _ in range(numbers[0])]
            for j, job in enumerate(jobs):
                job.extend([1 + (j + i) % 1000 for i in range(COST_CONTEXT)])
        started = time.perf_counter()
        with torch.inference_mode():
            if op == "pass":
                lm.extend(list(range(7, 7 + numbers[0])))
            elif op == "batch":
                extend_batch(jobs, [list(range(7, 7 + numbers[1]))] * numbers[0])
            else:
                fresh = lm.fork()
                fresh.extend([1 + i % 1000 for i in range(numbers[0])])
        spent = (time.perf_counter() - started) * 1e3
        if op == "pass":
            lm.rollback(numbers[0])
        elif op == "batch":
            for job in jobs:
                job.rollback(numbers[1])
        print(f"{spent:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, help="the tree to compare with (required)")
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--rows", default="1,7,28")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--batch", default="4x7", help="JxR, or empty for none")
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--prefill-repeat", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=1)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.model)
        return
    if args.before is None:
        parser.error("--before DIR is required")
    os.sched_setaffinity(0, {args.cpu})  # the workers inherit it
    sides = {}
    for name, root in (("before", args.before), ("after", args.after)):
        cmd = [sys.executable, __file__, "--worker", str(root.resolve()), "--model", str(args.model)]
        sides[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        print(f"{name}: {sides[name].stdout.readline().strip()} s", flush=True)
    ops = [f"pass {r}" for r in args.rows.split(",") if r]
    if args.batch:
        jobs, rows = args.batch.split("x")
        ops.append(f"batch {jobs} {rows}")
    plan = [op for _ in range(args.repeat) for op in ops] + [f"prefill {args.prefill}"] * args.prefill_repeat
    samples: dict[tuple[str, str], list[float]] = {}
    for i, op in enumerate(plan):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        for name in order:
            sides[name].stdin.write(op + "\n")
            sides[name].stdin.flush()
            samples.setdefault((op, name), []).append(float(sides[name].stdout.readline()))
    for side in sides.values():
        side.stdin.close()
        side.wait()
    print(f"{'':16} {'before ms':>22} {'after ms':>22} {'after/before':>12}")
    for op in dict.fromkeys(plan):
        b, a = samples[(op, "before")], samples[(op, "after")]
        mb, ma = statistics.median(b), statistics.median(a)
        print(f"{op:16} {mb:12.1f} (min {min(b):6.1f}) {ma:12.1f} (min {min(a):6.1f}) {ma / mb:12.3f}")


if __name__ == "__main__":
    main()
