"""`specmarket demo`: the local demo, every drafter in one process (`make demo` runs the networked one).

Shows, on the tiny pair and fixed prompts, that every drafter leaves the GUMBEL output identical
to plain decoding, that an honest drafter cuts target passes, and that the textbook LEVIATHAN rule
is forged by a lying drafter. The rules' mechanics do not depend on the model, so this quick demo
stays on the tiny pair; the real pair's demo is demo-net.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from node.lab.plots import write_theory_plots
from node.lab.workload import WORKLOADS
from node.model.decoding import GenerateConfig, generate
from node.model.loading import load_pair
from node.model.pairs import get_pair
from verifier.params import SamplingParams
from verifier.verify import Rule

DEMO_RUNS = (
    ("none", Rule.GUMBEL),
    ("honest", Rule.GUMBEL),
    ("random", Rule.GUMBEL),
    ("adversarial", Rule.GUMBEL),
    ("lying", Rule.GUMBEL),
    ("garbage", Rule.GUMBEL),
    ("honest", Rule.LEVIATHAN),
    ("lying", Rule.LEVIATHAN),
)
DEMO_PARAMS = SamplingParams(temperature=0.8)
LOCAL_DEMO_PAIR = "tiny"


def _row(drafter: str, rule: Rule, runs: list[dict], reference: list[list[int]]) -> dict:
    n_tokens = sum(len(r["tokens"]) for r in runs)
    wall = sum(r["stats"]["wall_seconds"] for r in runs)
    proposed = sum(r["stats"]["draft_tokens_proposed"] for r in runs)
    accepted = sum(r["stats"]["draft_tokens_accepted"] for r in runs)
    return {
        "drafter": drafter,
        "rule": rule.value,
        "identical_to_plain": all(r["tokens"] == ref for r, ref in zip(runs, reference, strict=True)),
        "tokens_per_second": round(n_tokens / wall, 1) if wall else 0.0,
        "target_passes": sum(r["stats"]["target_passes"] for r in runs),
        "acceptance_rate": round(accepted / proposed, 3) if proposed else 0.0,
        "invalid_proposals": sum(r["stats"]["invalid_proposals"] for r in runs),
    }


def _print_table(rows: list[dict]) -> None:
    header = (
        f"{'drafter':<12} {'rule':<10} {'same as plain':<14} {'tok/s':>7} {'passes':>7} {'accept':>7} {'invalid':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['drafter']:<12} {r['rule']:<10} {('yes' if r['identical_to_plain'] else 'NO'):<14} "
            f"{r['tokens_per_second']:>7} {r['target_passes']:>7} {r['acceptance_rate']:>7} {r['invalid_proposals']:>8}"
        )


def run_demo(max_new_tokens: int, out: Path) -> int:
    pair = load_pair(get_pair(LOCAL_DEMO_PAIR).target_dir(), get_pair(LOCAL_DEMO_PAIR).draft_dir())
    base = GenerateConfig(
        prompt="", max_new_tokens=max_new_tokens, params=DEMO_PARAMS, pair=LOCAL_DEMO_PAIR, ignore_eos=True
    )
    rows, reference = [], []
    for drafter, rule in tqdm(DEMO_RUNS, desc="demo runs", unit="config"):
        runs = [
            generate(replace(base, prompt=p, seed=i, drafter=drafter, rule=rule), pair)
            for i, p in enumerate(WORKLOADS[LOCAL_DEMO_PAIR].local_demo)
        ]
        if drafter == "none":
            reference = [r["tokens"] for r in runs]
        rows.append(_row(drafter, rule, runs, reference))
        if drafter == "lying" and rule is Rule.LEVIATHAN:
            print(f"\nLEVIATHAN + lying drafter, prompt 1 continuation:\n{runs[0]['text']!r}\n")
    _print_table(rows)
    gumbel_ok = all(r["identical_to_plain"] for r in rows if r["rule"] == "gumbel")
    forged = not next(r for r in rows if r["drafter"] == "lying" and r["rule"] == "leviathan")["identical_to_plain"]
    print(f"\nGUMBEL output identical to plain decoding for every drafter: {gumbel_ok}")
    print(f"textbook LEVIATHAN rule forged by the lying drafter: {forged}")
    print("(LEVIATHAN is exact only in distribution, and only for honest drafters: its samples differ from")
    print(" plain decoding even with the honest local draft; GUMBEL reproduces plain decoding exactly.)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(
        json.dumps({"rows": rows, "prompts": WORKLOADS[LOCAL_DEMO_PAIR].local_demo}, indent=2)
    )
    write_theory_plots([0.5, 0.7, 0.9], 0.1, 4, 2000, out)
    print(f"wrote {out / 'demo.json'} and theory plots in {out}/")
    return 0 if gumbel_ok else 1
