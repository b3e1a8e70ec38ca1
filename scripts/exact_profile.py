"""Where an exact model's pass goes: time one-thread passes of 1, 7, 28 ... rows after a context of
--context tokens, and split them by operation (each product by its type and shape, the norms,
attention, SiLU, the embedding, the rest: Python and torch glue).

    .venv/bin/python scripts/exact_profile.py --model .cache/models/qwen2.5-coder-1.5b-instruct-exact \
        [--context 512] [--rows 1,7,28] [--repeat 5] [--sources DIR]

--sources DIR builds exact.c (exact_amx.c) and ops.c from DIR instead (a saved copy of earlier code), so that two
versions can be compared on the same machine, one after the other, in one run of each (the C must export what
this tree's model.py calls; scripts/exact_ab.py compares two whole trees, C and Python, side by side).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from node.model.exact import kernel, model  # noqa: E402

torch.set_num_threads(1)
SPENT: dict[str, list[float]] = defaultdict(list)


def timed(label, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPENT[label(*args)].append(time.perf_counter() - start)

    return wrapper


def instrument() -> None:
    def linear_label(self, x):
        return "product " + "+".join(f"{p.kind} {p.n}x{p.k}" for p in self.parts)

    model.ExactLinear.__call__ = timed(linear_label, model.ExactLinear.__call__)
    model.ExactRMSNorm.__call__ = timed(lambda *a: "rmsnorm", model.ExactRMSNorm.__call__)
    model.ExactLM.attend = timed(lambda *a: "attention (rope, cache, attend)", model.ExactLM.attend)
    model.ExactWeights.embed = timed(lambda *a: "embedding", model.ExactWeights.embed)


def load(directory: Path, sources: Path | None):
    if sources is not None:
        names = ("exact.c", "exact_vnni.c", "exact_amx.c", "exact_pack.c", "ops.c")
        kernel.SOURCES = tuple(sources / name for name in names if (sources / name).is_file())
    lib = kernel.library()
    cfg = json.loads((directory / "config.json").read_text())
    return model.load_exact_lm(directory, cfg, "profile", lib)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=ROOT / ".cache/models/qwen2.5-coder-1.5b-instruct-exact")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--rows", default="1,7,28")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--sources", type=Path)
    parser.add_argument("--prefill", action="store_true", help="time the context's prefill as one pass")
    parser.add_argument("--split", action="store_true", help="split each pass by operation")
    args = parser.parse_args()
    lm = load(args.model, args.sources)
    context = [(17 * i + 5) % 150000 for i in range(args.context)]
    start = time.perf_counter()
    lm.extend(context)
    print(f"prefill of {args.context} tokens: {time.perf_counter() - start:.2f} s", flush=True)
    if args.split:
        instrument()
    for rows in [int(r) for r in args.rows.split(",")]:
        tokens = [(31 * i + 7) % 150000 for i in range(rows)]
        times = []
        SPENT.clear()
        for _ in range(args.repeat):
            start = time.perf_counter()
            lm.extend(tokens)
            times.append(time.perf_counter() - start)
            lm.rollback(rows)
        total = statistics.median(times) * 1e3
        print(f"t({rows}) = {total:.1f} ms (median of {args.repeat}; min {min(times) * 1e3:.1f})", flush=True)
        if args.split:
            accounted = 0.0
            for label, spent in sorted(SPENT.items(), key=lambda kv: -sum(kv[1])):
                per_pass = sum(spent) / args.repeat * 1e3
                accounted += per_pass
                print(f"    {per_pass:8.2f} ms  {len(spent) // args.repeat:3d}x  {label}")
            print(f"    {statistics.mean(times) * 1e3 - accounted:8.2f} ms        the rest (glue)")


if __name__ == "__main__":
    main()
