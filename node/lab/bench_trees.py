"""``specmarket bench-trees``: trees of competing drafts against each drafter alone, in one run.

On the same prompts, seeds and target (the served kernel), each mode decodes every prompt:
- ``draft``: the 0.5B draft's chain (the market's best single drafter);
- ``lookup``: prompt lookup's chain (verifier.lookup: a drafter that costs nothing);
- ``tree``: both merged into one tree per round (verifier.tree), verified in one pass;
- ``plain``: no drafts (the reference: every mode's tokens must equal it).
It prints tokens per target pass and ms per token for each, and the tree's ratios to the best
single drafter: the issue's goals are ≥ 1.15× tokens per pass and ≥ 1.1× end to end.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from tqdm import tqdm

from node.lab.bench_local import load_lab_pair, write_json
from node.lab.workload import QWEN_PROMPTS, prompt_ids
from node.model.kernels import cpu_summary
from verifier.decode import DecodeResult, decode
from verifier.lookup import PromptLookupProposer, TreeProposer
from verifier.params import SamplingParams
from verifier.proposers import LocalDraftProposer
from verifier.tree import DEFAULT_TREE_NODES

log = logging.getLogger(__name__)

MODES = ("plain", "draft", "lookup", "tree")
TOKENS_PER_PASS_GOAL = 1.15
END_TO_END_GOAL = 1.1
UNREPORTED = ("outputs", "credits", "benched")  # a mode's fields not in its row (a p2p report lists them apart)


def _proposer(mode: str, pair, tree_nodes: int):
    if mode == "plain":
        return None
    if mode == "lookup":
        return PromptLookupProposer()
    draft = LocalDraftProposer(pair.draft.fork())
    return draft if mode == "draft" else TreeProposer([draft], lookup=True, max_nodes=tree_nodes)


def _run_mode(mode: str, pair, prompts, params, seed: int, tokens: int, gamma: int, tree_nodes: int) -> dict:
    results: list[DecodeResult] = []
    started = time.perf_counter()
    for ids in tqdm(prompts, desc=mode, unit="prompt", file=sys.stderr):
        proposer = _proposer(mode, pair, tree_nodes)
        results.append(
            decode(pair.target.fork(), proposer, ids, params=params, seed=seed, max_new_tokens=tokens, gamma=gamma)
        )
    seconds = time.perf_counter() - started
    emitted = sum(len(r.tokens) for r in results)
    passes = sum(r.stats.target_passes - 1 for r in results)  # without each prompt's prefill pass
    rows = sum(r.stats.target_positions for r in results) - sum(len(ids) for ids in prompts)
    return {
        "outputs": [list(r.tokens) for r in results],
        "tokens": emitted,
        "tokens_per_pass": round((emitted - len(results)) / max(1, passes), 4),  # the prefill's token aside
        "rows_per_pass": round(rows / max(1, passes), 3),
        "ms_per_token": round(1000 * seconds / max(1, emitted), 2),
    }


def run_bench_trees(
    *, tokens: int = 64, gamma: int = 4, temperature: float = 0.0, seed: int = 1, tree_nodes: int = DEFAULT_TREE_NODES,
    n_prompts: int = len(QWEN_PROMPTS), out: Path | None = None,
) -> dict:  # fmt: skip
    import torch

    torch.set_num_threads(1)  # one pass at a time per core, as the target node runs them
    pair = load_lab_pair("qwen2.5-coder")
    prompts = [prompt_ids(pair.tokenizer, p, chat=True) for p in QWEN_PROMPTS[:n_prompts]]  # code, then chat
    params = SamplingParams(temperature=temperature)
    modes = {m: _run_mode(m, pair, prompts, params, seed, tokens, gamma, tree_nodes) for m in MODES}
    report = {
        "cpu": cpu_summary(), "prompts": len(prompts), "tokens": tokens, "gamma": gamma, "temperature": temperature,
        "seed": seed,
        "tree_nodes": tree_nodes,
        **ratios(modes),
    }  # fmt: skip
    print_report(report)
    if out is not None:
        write_json(out / "bench_trees.json", report)
    return report


def ratios(modes: dict[str, dict]) -> dict:
    """Each mode's figures (and whether its outputs are plain decoding's), the best single drafter
    by tokens per pass, and the tree's ratios to it."""
    plain = modes["plain"]["outputs"]
    best = max(("draft", "lookup"), key=lambda m: modes[m]["tokens_per_pass"])
    tree = modes["tree"]
    return {
        "modes": {m: {k: v for k, v in r.items() if k not in UNREPORTED} | {"identical": r["outputs"] == plain}
                  for m, r in modes.items()},
        "best_single": best,
        "tree_tokens_per_pass_ratio": round(tree["tokens_per_pass"] / modes[best]["tokens_per_pass"], 3),
        "tree_speed_ratio": round(modes[best]["ms_per_token"] / tree["ms_per_token"], 3),
    }  # fmt: skip


def rows_cell(row: dict) -> str:
    """A mode's rows per pass as printed (bench-trees and the report)."""
    return f"{row['rows_per_pass']:.2f}" if "rows_per_pass" in row else "-"  # (no draft rounds: none measured)


def print_report(report: dict) -> None:
    print(f"{'mode':<8} {'tok/pass':>9} {'rows/pass':>10} {'ms/token':>9}  identical to plain")
    for mode, r in report["modes"].items():
        print(f"{mode:<8} {r['tokens_per_pass']:>9.3f} {rows_cell(r):>10} {r['ms_per_token']:>9.1f}  {r['identical']}")
    print(
        f"tree / best single drafter ({report['best_single']}): {report['tree_tokens_per_pass_ratio']:.3f}x tokens "
        f"per pass (goal {TOKENS_PER_PASS_GOAL}), {report['tree_speed_ratio']:.3f}x end to end (goal {END_TO_END_GOAL})"
    )
