"""The report's sections on serving many clients and on trees of drafts, rendered from the JSON that
``specmarket bench-serve --out report`` and ``specmarket bench-trees --out report`` leave beside it
(the demo does not run them: they take about as long as the demo, and they may have run on
another machine than the demo: each section names its CPU). Each goal is printed with the
measured ratio, and a missed one with by how much and why."""

from __future__ import annotations

import json
from pathlib import Path

from market.policy import PolicyConfig
from node.lab.bench_serve import P95_GOAL, THROUGHPUT_GOAL
from node.lab.bench_trees import END_TO_END_GOAL, TOKENS_PER_PASS_GOAL, rows_cell
from node.target.config import TargetConfig

JUDGE_AFTER, MIN_MATCH_RATE = TargetConfig.judge_after_tokens, PolicyConfig.min_match_rate

SERVE_JSON, TREES_JSON, TREES_P2P_JSON = "bench_serve.json", "bench_trees.json", "bench_trees_p2p.json"

# why the goals are missed on a 2-core CPU (docs/target-performance.md, "Serving many clients")
SERVE_WHY = (
    "A verification pass here is memory-bound only up to about 5 rows: past that each row costs its own "
    "FMA per weight (fp32, AVX-512: 16 a cycle on a core), so a shared pass of 4 jobs' rows costs several "
    "times one job's pass, while unbatched jobs already run their passes side by side on the two cores. "
    "With the drafts on the same cores (the spec modes), drafting takes a share of the CPU that batching "
    "cannot shrink."
)
TREES_WHY = (
    "The 0.5B draft already accepts most of each block, and prompt lookup rarely finds a match the draft "
    "missed on these prompts (they ask for new code and prose, not edits of the prompt), while every node of "
    "the tree widens the pass."
)
TREES_P2P_WHY = (
    "A prompt-lookup peer answers with 1-token matches too, which add nodes that are almost never accepted, "
    "and the market benches it once its match rate falls under its floor."
)


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(str(c) for c in row) + " |" for row in rows)])


def _cpu(report: dict) -> str:
    return report.get("cpu", "the CPU it ran on")


def _goal(label: str, measured: float, goal: float, at_most: bool = False) -> str:
    met = measured <= goal if at_most else measured >= goal
    verdict = "met" if met else f"missed by {abs(measured - goal) / goal:.0%}"
    return f"- {label}: **{measured:.2f}** (goal {'≤' if at_most else '≥'} {goal}): {verdict}"


def serve_section(report: dict) -> str:
    rows = [
        [
            n,
            mode,
            f"{r['tokens_per_s']:.2f}",
            f"{r['p50_ms']:.0f}",
            f"{r['p95_ms']:.0f}",
            "yes" if r["identical"] else "NO",
        ]
        for n, modes in report["clients"].items()
        for mode, r in modes.items()
    ]
    goals = [
        _goal(f"{kind}-batched / {kind}, tokens/s at 4 clients", report[f"{kind}_throughput_ratio_4"], THROUGHPUT_GOAL)
        + "\n"
        + _goal(f"{kind}-batched p95 at 4 clients / 1 client", report[f"{kind}_p95_ratio_4_to_1"], P95_GOAL, True)
        for kind in ("spec", "remote")
        if f"{kind}_throughput_ratio_4" in report
    ]
    missed = any("missed" in g for g in goals)
    return "\n\n".join(
        [
            "## Serving many clients (`specmarket bench-serve`)",
            f"On {_cpu(report)}: {report['tokens']} tokens per client, greedy, γ = {report['gamma']}, "
            "shared passes of up to "
            f"{report['batch_rows']} rows. `spec`: each job drafts with its own fork of the 0.5B draft on the "
            "target's two cores; `remote`: the same drafts made beforehand, as by drafter peers on machines of "
            "their own. Latency per token: the engine's inter-token samples.",
            _table(["clients", "mode", "tokens/s", "p50 ms", "p95 ms", "output = plain"], rows),
            "\n".join(goals),
            f"Why: {SERVE_WHY}" if missed else "",
        ]
    )


def trees_section(report: dict) -> str:
    rows = [
        [
            mode,
            f"{r['tokens_per_pass']:.3f}",
            rows_cell(r),
            f"{r['ms_per_token']:.1f}",
            "yes" if r["identical"] else "NO",
        ]
        for mode, r in report["modes"].items()
    ]
    goals = [
        _goal(
            f"tree / {report['best_single']}, tokens per pass",
            report["tree_tokens_per_pass_ratio"],
            TOKENS_PER_PASS_GOAL,
        ),
        _goal(f"tree / {report['best_single']}, end to end", report["tree_speed_ratio"], END_TO_END_GOAL),
    ]
    missed = any("missed" in g for g in goals)
    p2p = report.get("transport") == "libp2p"
    where = (
        "over libp2p: a target process per mode, the 0.5B draft and prompt lookup each a drafter peer of its own"
        if p2p
        else "in process on the served kernel"
    )
    credits = "; ".join(
        f"{mode}: " + ", ".join(f"{who} {n}" for who, n in sorted(c.items()))
        for mode, c in report.get("credits", {}).items()
        if c
    )
    return "\n\n".join(
        part
        for part in [
            f"## Trees of drafts (`specmarket bench-trees{' --p2p' if p2p else ''}`)",
            f"On {_cpu(report)}: {report['prompts']} prompts (code, then chat), {report['tokens']} tokens, "
            f"T = {report['temperature']}, "
            f"γ = {report['gamma']}, trees of up to {report['tree_nodes']} nodes, {where}.",
            _table(["mode", "tokens per pass", "rows per pass", "ms per token", "output = plain"], rows),
            "\n".join(goals),
            f"Tokens credited to each drafter peer: {credits}." if credits else "",
            _benched(report),
            f"Why: {_trees_why(report)}" if missed else "",
        ]
        if part
    )


def _trees_why(report: dict) -> str:
    """Why a tree goal was missed: the drafts' overlap, and what the tree's extra rows cost (measured)."""
    tree, best = report["modes"]["tree"], report["modes"][report["best_single"]]
    if "rows_per_pass" not in tree:
        return TREES_WHY
    peer = f" {TREES_P2P_WHY}" if report.get("transport") == "libp2p" else ""
    return (
        f"{TREES_WHY}{peer} Here a tree pass scored {tree['rows_per_pass']:.2f} rows against "
        f"{best['rows_per_pass']:.2f} for {report['best_single']} alone, and passes are compute-bound past a "
        "few rows on this CPU (docs/target-performance.md)."
    )


def _benched(report: dict) -> str:
    """The drafter peers the market had benched when a mode ended (p2p runs), as the report's line."""
    benched = report.get("benched_at_end", {})
    if not benched:
        return ""
    modes = "; ".join(f"{mode}: {', '.join(peers)}" for mode, peers in benched.items())
    floor = f"a match rate under {MIN_MATCH_RATE:.0%} over their last {JUDGE_AFTER} or more offered tokens"
    return f"Benched by the market when the mode ended ({floor}; an empty answer offers γ tokens): {modes}."


def serving_sections(out: Path) -> str:
    """The sections for the benchmark JSON found in ``out`` (empty when there is none)."""
    parts = []
    for name, render in ((SERVE_JSON, serve_section), (TREES_JSON, trees_section), (TREES_P2P_JSON, trees_section)):
        if (out / name).is_file():
            parts.append(render(json.loads((out / name).read_text())))
    return "\n\n".join(parts)
