"""``specmarket bench-trees --p2p``: trees of competing drafts over libp2p, against each drafter alone.

The issue's setting: two honest drafter *peers* of different kinds, the 0.5B draft (``--strategy
honest``) and prompt lookup (``--strategy lookup``, a drafter with no model work), each its own
process on the drafters' core, found by a target node (its own process on the other core) through
its rendezvous point. One target per mode, one after the other, on the same prompts and seeds:
- ``plain``: no drafters (``--max-drafters 0``), the reference every output must equal;
- ``draft``: the 0.5B peer alone, chains (``--tree-nodes 0``);
- ``lookup``: the lookup peer alone, chains;
- ``tree``: both peers asked each round (``--max-drafters 2``), their answers and the target's own
  lookup branch merged into one tree (``--tree-nodes``).
Each speculating target is warmed up first (not measured) until every drafter has been judged:
before that a job asks at most one untried drafter, and a tree needs both. Tokens per pass and ms
per token (the client's wall clock, HTTP included) are printed as bench-trees prints them, with the
tree's ratios to the best single drafter.
"""

from __future__ import annotations

import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from tqdm import tqdm

from node.client.http import http_json
from node.lab.bench_local import write_json
from node.lab.bench_trees import print_report, ratios
from node.lab.demo_net import MAX_WARM_UP_JOBS_PER_DRAFTER, WARM_UP_SEED
from node.lab.procs import ProcessGroup, core_split, start_drafter, start_target, wait_for_drafters, warm_up_market
from node.lab.workload import WORKLOADS, ask, credited, job_rounds
from node.model.kernels import cpu_summary
from verifier.tree import DEFAULT_TREE_NODES

DEFAULT_P2P_PAIR = "qwen2.5-coder"  # the pair (the tests run the tiny one)
DEFAULT_PROMPTS = 8
# a warm-up job long enough for its one untried drafter to be judged (TargetConfig.judge_after_tokens
# offered): a job asks at most one untried drafter, so until both are judged a job drafts with one
WARM_UP_TOKENS = 32
# not measured; an edit of code in the prompt, so that prompt lookup finds matches: a drafter whose
# first 32 offered tokens all go unmatched (an empty answer offers γ tokens all the same) is benched
WARM_UP_PROMPT = (
    "Add type hints to this function and return it whole:\n```python\ndef mean(xs):\n    total = 0\n"
    "    for x in xs:\n        total += x\n    return total / len(xs)\n```"
)
P2P_JSON = "bench_trees_p2p.json"
# mode -> (the drafter peers' strategies, the target's options past --gamma)
P2P_MODES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "plain": ((), ("--max-drafters", "0")),
    "draft": (("honest",), ("--max-drafters", "1", "--tree-nodes", "0")),
    "lookup": (("lookup",), ("--max-drafters", "1", "--tree-nodes", "0")),
    "tree": (("honest", "lookup"), ("--max-drafters", "2")),
}


def progress(message: str) -> None:
    print(f"[bench-trees --p2p {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _serve(http: str, prompts: tuple[str, ...], settings: dict, mode: str) -> dict:
    """Every prompt once, one after the other; tokens per pass counts neither the prefill pass nor
    the token it emits (as bench-trees does in process)."""
    chat, tokens, temperature = WORKLOADS[settings["pair"]].chat, settings["tokens"], settings["temperature"]
    answers, started = [], time.perf_counter()
    for i, prompt in enumerate(tqdm(prompts, desc=mode, unit="prompt", file=sys.stderr)):
        answers.append(ask(http, prompt, chat, seed=settings["seed"] + i, max_tokens=tokens, temperature=temperature))
    seconds = time.perf_counter() - started
    outputs = [list(a["specmarket"]["tokens"]) for a in answers]
    emitted = sum(len(o) for o in outputs)
    passes = sum(a["specmarket"]["stats"]["target_passes"] - 1 for a in answers)
    # rows a verification pass scored: each round's verified nodes and the token before them (the
    # engine's positions also count each prompt's prefill, which the prefix cache shortens)
    rounds = [r for a in answers for r in job_rounds(http, a["specmarket"]["job"])]
    return {
        "outputs": outputs,
        "tokens": emitted,
        "tokens_per_pass": round((emitted - len(answers)) / max(1, passes), 4),
        **({"rows_per_pass": round(sum(r["drafted"] + 1 for r in rounds) / len(rounds), 3)} if rounds else {}),
        "ms_per_token": round(1000 * seconds / max(1, emitted), 2),
        "lookup_tokens_accepted": sum(a["specmarket"]["stats"].get("lookup_tokens_accepted", 0) for a in answers),
        "credits": credited(answers),
    }


def _run_mode(mode: str, work: Path, prompts: tuple[str, ...], settings: dict) -> dict:
    """One target (and its drafter peers) for ``mode``: started, warmed up, measured, stopped."""
    strategies, options = P2P_MODES[mode]
    target_cpus, drafter_cpus = core_split()
    tree = ("--tree-nodes", str(settings["tree_nodes"])) if mode == "tree" else ()
    with ProcessGroup() as group:
        progress(f"{mode}: starting a target and {len(strategies)} drafter peer(s) (each loads its models)")
        target = start_target(
            work, "--gamma", str(settings["gamma"]), "--wait-budget", "0", *options, *tree,
            name=f"target-{mode}", group=group, pair=settings["pair"], cpus=target_cpus,
        )  # fmt: skip
        http, bootstrap = target.lines["http"][0], target.lines["multiaddr"][0]
        drafter = partial(start_drafter, work, bootstrap, pair=settings["pair"], cpus=drafter_cpus)
        peers = group.start_all([partial(drafter, s, f"drafter-{mode}-{s}") for s in strategies])
        names = {p.lines["multiaddr"][0].rsplit("/p2p/", 1)[-1]: s for p, s in zip(peers, strategies, strict=True)}
        if strategies:
            wait_for_drafters(http, len(strategies))

            def warm(i: int) -> None:
                chat, seed = WORKLOADS[settings["pair"]].chat, WARM_UP_SEED + i
                ask(http, WARM_UP_PROMPT, chat, seed=seed, max_tokens=WARM_UP_TOKENS, temperature=0.0)

            most = MAX_WARM_UP_JOBS_PER_DRAFTER * len(strategies)
            jobs = warm_up_market(http, len(strategies), warm, most, judge_all=True)
            progress(f"{mode}: warmed up with {jobs} job(s)")
        result = _serve(http, prompts, settings, mode)
        result["benched"] = sorted(
            names.get(p, p) for p, row in http_json(f"{http}/health")["drafters"].items() if row["benched"]
        )
    result["credits"] = {names.get(peer, peer): n for peer, n in result["credits"].items()}  # by strategy
    return result


def run_bench_trees_p2p(
    *, tokens: int = 64, gamma: int = 4, temperature: float = 0.0, seed: int = 1, tree_nodes: int = DEFAULT_TREE_NODES,
    n_prompts: int = DEFAULT_PROMPTS, pair: str = DEFAULT_P2P_PAIR, out: Path | None = None,
) -> dict:  # fmt: skip
    settings = {"tokens": tokens, "gamma": gamma, "temperature": temperature, "seed": seed, "tree_nodes": tree_nodes}
    settings["pair"] = pair
    prompts = WORKLOADS[pair].bench[:n_prompts]
    with tempfile.TemporaryDirectory(prefix="specmarket-bench-trees-p2p-") as tmp:
        modes = {mode: _run_mode(mode, Path(tmp), prompts, settings) for mode in P2P_MODES}
    report = {
        "transport": "libp2p", "cpu": cpu_summary(), "prompts": len(prompts), **settings, **ratios(modes),
        "credits": {mode: r["credits"] for mode, r in modes.items()},
        "benched_at_end": {mode: r["benched"] for mode, r in modes.items() if r["benched"]},
    }  # fmt: skip
    print_report(report)
    if out is not None:
        write_json(out / P2P_JSON, report)
    return report
