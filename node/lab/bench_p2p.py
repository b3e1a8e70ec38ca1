"""P2P benchmark: plain vs local speculative vs drafter peers over libp2p (honest, with and without
overlap; hostile only) vs HF.

One process (plus drafter subprocesses), one run, the prompts, pair and seeds of bench_local; modes
are interleaved and the median over repeats is reported. Three TargetNodes run in this process on one
trio loop in a background thread, each with its drafters found through its rendezvous point: one
honest drafter that overlaps drafting with verification (the default), one honest drafter with
--no-overlap, and only hostile drafters. The hostile node gets no warm-up: exploring and benching
hostile drafters is part of its cost. Every speculative output is checked token for token against
plain decoding. Aims (not tests): honest p2p >= 1.0x best HF assisted; hostile >= 0.9x plain.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.drafter.config import DEFAULT_MIN_CONFIDENCE
from node.drafter.strategies import DEFAULT_SLOW_MS
from node.lab.bench_local import HF_ASSISTED, hf_modes, load_lab_pair, measure_costs, time_runs, write_json
from node.lab.config import P2PBenchConfig
from node.lab.procs import CHILD_ENV, ProcessGroup, core_split, start_drafter, wait_for_drafters
from node.lab.trio_thread import TrioThread
from node.lab.workload import WORKLOADS, prompt_ids
from node.model.adapter import HFCausalLM
from node.model.loading import ModelPair
from node.runtime.lifecycle import sigterm_unwinds
from node.target.engine import CompletionRequest, Engine
from verifier.params import SamplingParams
from verifier.proposal import Proposal
from verifier.proposers import LocalDraftProposer
from verifier.theory import alpha_from_omega, speedup

if TYPE_CHECKING:
    from node.target.node import TargetNode

log = logging.getLogger(__name__)

HOSTILE = ("random", "adversarial", "lying", "slow", "garbage", "flaky")
STARTUP_TIMEOUT_S = 240.0  # seven drafter processes importing torch and libp2p on two cores
ENGINE_MODES = ("plain", "local", "p2p_honest", "p2p_honest_no_overlap", "p2p_hostile")
CHECKED = ("local", "p2p_honest", "p2p_honest_no_overlap", "p2p_hostile")  # must equal plain token for token
# the goals of the real-model issue: p2p speculation against HF's assisted generation of the same
# pair, against the S bound of its own measured α, c and v, against in-process speculation; hostile
# drafters against plain decoding
AIMS = {
    "p2p_honest_vs_best_hf_assisted": 1.2,
    "p2p_honest_vs_bound": 0.85,
    "p2p_honest_vs_local": 1.0,
    "p2p_hostile_vs_plain": 0.95,
}
TARGETS = {"honest": "p2p_honest", "honest_no_overlap": "p2p_honest_no_overlap", "hostile": "p2p_hostile"}
# per repeat, pooled over its jobs (node/target/draft_timing.py, the engine's pass time)
TIMINGS = ("target_pass_ms_per_round", "draft_round_trip_ms_per_answer", "draft_transport_ms_per_answer")
TIMINGS += ("draft_wait_ms_max", "draft_early_hits", "draft_early_ready", "draft_early_stale")
MEDIANS = ("acceptance_rate", "mean_accepted_length", "mean_draft_length", "target_passes", "draft_wait_ms_per_round")
MEDIANS += TIMINGS
PER_REPEAT = ("tokens_per_second", "draft_empty_rounds", "deadline_misses")
SNAPSHOT_DROPPED = ("addrs", "seen_ago_s", "known_for_s")  # registry fields the report leaves out


def progress(message: str) -> None:
    print(f"[bench-p2p {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _call(loop: TrioThread, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on the loop's thread (the registry is the trio loop's to read)."""
    return trio.from_thread.run_sync(fn, *args, trio_token=loop.token)


@dataclass
class Market:
    loop: TrioThread
    targets: dict[str, TargetNode]  # name in TARGETS -> node
    drafters: dict[str, str]  # peer id -> strategy (the honest ones: "honest", "honest_no_overlap")

    def node(self, mode: str) -> TargetNode | None:
        return {TARGETS[name]: node for name, node in self.targets.items()}.get(mode)

    def snapshot(self, node: TargetNode) -> dict[str, dict]:
        return _call(self.loop, node.registry.snapshot)


def start_target_node(
    loop: TrioThread, pair: ModelPair, pair_name: str, gamma: int, draft_deadline_ms: float | None, data_dir: Path
) -> tuple[TargetNode, str]:
    """A target node in this process (on ``loop``); returns it and its HTTP URL."""
    from node.target.config import TargetConfig  # the libp2p and HTTP stacks, only when benchmarking
    from node.target.node import TargetNode

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)  # its ERRORs about hostile peers are expected here
    # wait_budget 0: the benchmark measures speculation as such, not the market's fallback to plain decoding
    tcfg = TargetConfig(
        http="127.0.0.1:0",
        data_dir=data_dir,
        gamma=gamma,
        draft_deadline_ms=draft_deadline_ms,
        pair=pair_name,
        wait_budget=0.0,
    )
    node = TargetNode(tcfg, pair)
    info, _ = loop.start(node.run)
    return node, info["http"]


@contextmanager
def running_market(
    pair: ModelPair, cfg: P2PBenchConfig, tmp: Path, drafter_cpus: frozenset[int] | None = None
) -> Iterator[Market]:
    """Three targets; an honest drafter process for each of the first two (overlap on, off) and six
    hostile ones for the third; all stopped on exit (Ctrl-C too)."""
    loop, nodes, urls = TrioThread(), {}, {}
    try:
        with ProcessGroup() as group:
            for name in TARGETS:
                nodes[name], urls[name] = start_target_node(
                    loop, pair, cfg.pair, cfg.gamma, cfg.draft_deadline_ms, tmp / f"target-{name}"
                )
            roles = [("honest", "honest"), ("honest_no_overlap", "honest"), *(("hostile", h) for h in HOSTILE)]
            progress(f"starting {len(roles)} drafter processes (OMP_NUM_THREADS=1)")
            drafter = partial(start_drafter, tmp, pair=cfg.pair, cpus=drafter_cpus)
            starters = [
                partial(drafter, nodes[t].addrs[0], s, f"drafter{i}-{s}", *_drafter_flags(i, t))
                for i, (t, s) in enumerate(roles)
            ]
            started = group.start_all(starters)
            for name in TARGETS:
                wait_for_drafters(urls[name], sum(t == name for t, _ in roles), STARTUP_TIMEOUT_S)
            peers = [d.lines["multiaddr"][0].rsplit("/", 1)[-1] for d in started]
            names = [t if t != "hostile" else s for t, s in roles]
            yield Market(loop, nodes, dict(zip(peers, names, strict=True)))
    finally:
        with suppress(trio.RunFinishedError):  # the loop died with an error: it is already closed
            loop.close()
        for node in nodes.values():
            node.close()


def _drafter_flags(index: int, target: str) -> tuple[str, ...]:
    overlap = ("--no-overlap",) if target == "honest_no_overlap" else ()
    return ("--seed", str(index), *overlap)  # the slow drafter keeps its default delay, DEFAULT_SLOW_MS


class _TimedLocalProposer(LocalDraftProposer):
    """The in-process draft model as a JobProposer, timed like the market's proposer; its blocks end
    at the first unsure token, as a drafter peer's do (DEFAULT_MIN_CONFIDENCE)."""

    def __init__(self, draft: HFCausalLM) -> None:
        super().__init__(draft.fork(), min_confidence=DEFAULT_MIN_CONFIDENCE)
        self.wait_s, self.rounds = 0.0, 0

    def propose(self, context: Sequence[int], **kwargs: Any) -> Proposal:
        started = time.perf_counter()
        try:
            return super().propose(context, **kwargs)
        finally:
            self.wait_s, self.rounds = self.wait_s + time.perf_counter() - started, self.rounds + 1

    def finish(self, context: Sequence[int]) -> dict[str, int]:
        return {}

    def timing(self) -> dict[str, float | int]:
        return {"draft_rounds": self.rounds, "draft_empty_rounds": 0, "draft_wait_seconds": self.wait_s}

    def round_records(self) -> list[dict[str, float | int | str]]:
        return []  # in-process: no transport to split a round into


class LocalDrafting:
    """A DraftingBackend with the draft model in-process, so `local` pays the engine's overhead too."""

    def __init__(self, draft: HFCausalLM) -> None:
        self.draft = draft

    @asynccontextmanager
    async def job(self, job_id: str, params: SamplingParams, seed: int, gamma: int, max_tokens: int) -> AsyncIterator:
        yield _TimedLocalProposer(self.draft)


def _engine_mode(loop: TrioThread, engine: Engine, params: SamplingParams, cfg, texts: dict, sink: list[dict]):
    def run(ids: list[int], seed: int) -> list[int]:
        req = CompletionRequest(texts[tuple(ids)], cfg.max_new_tokens, params.temperature, seed=seed, ignore_eos=True)
        result = loop.run(engine.complete, req)
        sink.append({**result.stats, "tokens": len(result.tokens)})
        return list(result.tokens)

    return run


def _modes(pair: ModelPair, params: SamplingParams, cfg, market: Market, engines: dict, texts: dict, sinks: dict):
    modes = {
        name: _engine_mode(market.loop, engines[name], params, cfg, texts, sinks.setdefault(name, []))
        for name in ENGINE_MODES
    }
    hf = hf_modes(pair, params, cfg)  # none for an exact target
    if "hf_plain" in hf:
        modes["hf_generate"] = hf.pop("hf_plain")
    return modes | hf


def _repeat_record(tps: float, jobs: list[dict] | None, misses: int | None) -> dict:
    """One repeat of one mode: tok/s, engine stats pooled over its jobs, drafts that missed their round."""
    record: dict[str, float] = {"tokens_per_second": tps}
    total = {k: sum(j.get(k, 0) for j in jobs) for k in {k for j in jobs for k in j}} if jobs else {}
    if total:
        record["acceptance_rate"] = total["draft_tokens_accepted"] / max(1, total["draft_tokens_proposed"])
        record["mean_accepted_length"] = total["tokens"] / total["target_passes"]
        if total.get("draft_rounds"):
            record["mean_draft_length"] = total["draft_tokens_proposed"] / total["draft_rounds"]
        record["target_passes"] = total["target_passes"]
        if total.get("draft_rounds"):
            record["draft_wait_ms_per_round"] = 1000 * total["draft_wait_seconds"] / total["draft_rounds"]
        record.update(_pooled_timings(jobs, total))
    if misses is not None:
        record.update(draft_empty_rounds=total.get("draft_empty_rounds", 0), deadline_misses=misses)
    return record


def _pooled_timings(jobs: list[dict], total: dict) -> dict:
    """The drafting timings of one repeat's jobs taken together (absent where a mode has none)."""
    out: dict[str, float] = {}
    if "target_pass_ms_per_round" in total:
        out["target_pass_ms_per_round"] = statistics.mean(j["target_pass_ms_per_round"] for j in jobs)
    if total.get("draft_answers"):
        answers = total["draft_answers"]
        out["draft_transport_ms_per_answer"] = 1000 * total["draft_transport_seconds"] / answers
        weighted = sum(j.get("draft_round_trip_ms_per_answer", 0) * j.get("draft_answers", 0) for j in jobs)
        out["draft_round_trip_ms_per_answer"] = weighted / answers
    if "draft_wait_ms_max" in total:
        out["draft_wait_ms_max"] = max(j.get("draft_wait_ms_max", 0) for j in jobs)
    out.update({k: total[k] for k in ("draft_early_hits", "draft_early_ready", "draft_early_stale") if k in total})
    return out


def _summary(records: list[dict]) -> dict:
    """Medians over the repeats; per-repeat lists of tok/s and of the drafting failures."""
    row = {"tokens_per_second": round(statistics.median(r["tokens_per_second"] for r in records), 2)}
    for k in MEDIANS:
        if values := [r[k] for r in records if k in r]:
            row[k] = round(statistics.median(values), 4)
    row.update({f"{k}_per_repeat": [round(r[k], 2) for r in records] for k in PER_REPEAT if k in records[0]})
    return row


def speedup_bound(row: dict, costs: dict) -> dict:
    """S(α, γ, c, v) (Leviathan et al. 2023, eq. 1 with the verify cost v) from the mode's own
    measurements: α from its tokens per target pass Ω at its mean draft length γ̄ (departure: the
    paper's γ is fixed; honest drafters end blocks early), v from its mean verification pass, and c
    = t_draft(1) / t_target(1) of the pair."""
    gamma = row.get("mean_draft_length", 0.0)
    if gamma < 1:  # under a draft token a round (a deadline too short for the drafter): no α to fit
        return {"alpha": None, "mean_draft_length": round(gamma, 3), "c": round(costs["cost_c"], 4), "v": None,
                "bound": None}  # fmt: skip
    alpha = alpha_from_omega(min(row["mean_accepted_length"], gamma + 1), gamma)
    verify = row["target_pass_ms_per_round"] / costs["t_target_1_ms"]
    bound = speedup(alpha, gamma, costs["cost_c"], verify)
    return {
        "alpha": round(alpha, 4),
        "mean_draft_length": round(gamma, 3),
        "c": round(costs["cost_c"], 4),
        "v": round(verify, 4),
        "bound": round(bound, 4),
    }


def mode_ratios(rows: dict, bound: float | None) -> dict:
    """The ratios between the modes of one temperature, and against the S bound where there is one."""
    tps = {name: row["tokens_per_second"] for name, row in rows.items()}
    ratios = {
        "p2p_honest_vs_local": tps["p2p_honest"] / tps["local"],
        "p2p_honest_overlap_vs_no_overlap": tps["p2p_honest"] / tps["p2p_honest_no_overlap"],
        "p2p_hostile_vs_plain": tps["p2p_hostile"] / tps["plain"],
    }
    if bound:
        ratios["p2p_honest_vs_bound"] = rows["p2p_honest"]["speedup_vs_plain"] / bound
    if all(h in tps for h in HF_ASSISTED):
        ratios["p2p_honest_vs_best_hf_assisted"] = tps["p2p_honest"] / max(tps[h] for h in HF_ASSISTED)
    return {k: round(v, 3) for k, v in ratios.items()}


def _first_job(jobs: dict[str, list[dict]]) -> dict:
    """The first hostile job of a temperature block against plain decoding of the same prompt and seed."""
    hostile, plain = jobs["p2p_hostile"][0], jobs["plain"][0]
    keys = ("wall_seconds", "draft_rounds", "draft_empty_rounds", "draft_wait_seconds")
    return {
        **{k: hostile.get(k, 0) for k in keys},
        "plain_wall_seconds": plain["wall_seconds"],
        "slowdown_vs_plain": round(hostile["wall_seconds"] / plain["wall_seconds"], 3),
    }


def _timeouts(market: Market, mode: str) -> int | None:
    """Drafts that missed their round, as the mode's target counted them (None: not a p2p mode)."""
    node = market.node(mode)
    return None if node is None else sum(row["timeouts"] for row in market.snapshot(node).values())


def _run_repeats(prompts: list[list[int]], cfg: P2PBenchConfig, market: Market, modes: dict, sinks: dict) -> dict:
    records: dict[str, list[dict]] = {name: [] for name in modes}
    identical, mismatches, first_job = dict.fromkeys(CHECKED, 0), [], {}
    for r in range(cfg.repeats):
        outputs = {}
        for name, fn in modes.items():  # interleaved, so drift in machine speed hits every mode alike
            progress(f"repeat {r + 1}/{cfg.repeats}: {name}")
            jobs, timeouts = sinks.get(name), _timeouts(market, name)
            if jobs is not None:
                jobs.clear()
            tps, outputs[name] = time_runs(fn, prompts)
            misses = None if timeouts is None else _timeouts(market, name) - timeouts
            records[name].append(_repeat_record(tps, jobs, misses))
        first_job = first_job or _first_job(sinks)
        for name in CHECKED:
            for i, (got, want) in enumerate(zip(outputs[name], outputs["plain"], strict=True)):
                identical[name] += got == want
                if got != want:
                    mismatches.append({"mode": name, "repeat": r, "prompt": i, "got": got, "plain": want})
    identical = {name: f"{n}/{cfg.repeats * len(prompts)}" for name, n in identical.items()}
    return {"records": records, "identical_to_plain": identical, "mismatches": mismatches, "first_job": first_job}


def bench_temperature(
    pair: ModelPair,
    prompts: list[list[int]],
    cfg: P2PBenchConfig,
    market: Market,
    engines: dict,
    temperature: float,
    costs: dict,
) -> dict:
    progress(f"T={temperature}")
    texts = {tuple(ids): text for ids, text in zip(prompts, WORKLOADS[cfg.pair].bench[: len(prompts)], strict=True)}
    params, sinks = SamplingParams(temperature=temperature), {}
    modes = _modes(pair, params, cfg, market, engines, texts, sinks)
    for name, fn in modes.items():
        if name != "p2p_hostile":  # hostile drafters are measured from their first job
            fn(prompts[0], 0)  # warm-up
    run = _run_repeats(prompts, cfg, market, modes, sinks)
    rows = {name: _summary(recs) for name, recs in run.pop("records").items()}
    for row in rows.values():
        row["speedup_vs_plain"] = round(row["tokens_per_second"] / rows["plain"]["tokens_per_second"], 3)
    bound = speedup_bound(rows["p2p_honest"], costs)
    ratios = mode_ratios(rows, bound["bound"])
    aims = {k: {"aim": aim, "ratio": ratios[k], "met": ratios[k] >= aim} for k, aim in AIMS.items() if k in ratios}
    market_now = market_snapshot(market, market.targets["hostile"])
    return {
        "temperature": temperature,
        "modes": rows,
        "bound": bound,
        "ratios": ratios,
        "aims": aims,
        **run,
        "hostile": market_now,
    }


def market_snapshot(market: Market, node: TargetNode) -> dict:
    """Per drafter (by strategy) what the target's registry knows, and how many were benched."""
    strategy = market.drafters
    rows = {
        strategy.get(p, p): {k: v for k, v in row.items() if k not in SNAPSHOT_DROPPED}
        for p, row in market.snapshot(node).items()
    }
    benched = sum(r["bench_count"] > 0 for r in rows.values())
    return {"drafters": rows, "benched_at_least_once": benched, "benched_now": sum(r["benched"] for r in rows.values())}


def _cell(value: object) -> str:
    return "/".join(map(str, value)) if isinstance(value, list) else str(value)


def _print_temperature(t: dict, cfg: P2PBenchConfig) -> None:
    deadline = "each target's own" if cfg.draft_deadline_ms is None else f"{cfg.draft_deadline_ms:g} ms"
    print(f"\nT={t['temperature']}  (γ={cfg.gamma}, draft deadline {deadline})")
    cols = {"tokens_per_second": ("tok/s", 9), "speedup_vs_plain": ("vs plain", 10), "acceptance_rate": ("accept", 9)}
    cols |= {"mean_accepted_length": ("tok/pass", 10), "target_passes": ("passes", 8)}
    cols |= {"draft_wait_ms_per_round": ("wait ms/rnd", 13), "draft_empty_rounds_per_repeat": ("empty rnds", 14)}
    cols |= {"deadline_misses_per_repeat": ("misses", 12), "draft_early_hits": ("early hits", 12)}
    cols |= {"draft_transport_ms_per_answer": ("transport ms", 14), "target_pass_ms_per_round": ("pass ms", 9)}
    print(f"  {'mode':<24}" + "".join(f"{title:>{width}}" for title, width in cols.values()))
    for name, row in t["modes"].items():
        print(f"  {name:<24}" + "".join(f"{_cell(row.get(k, '')):>{w}}" for k, (_, w) in cols.items()))
    print("  identical to plain: " + ", ".join(f"{k} {v}" for k, v in t["identical_to_plain"].items()))
    b = t["bound"]
    print(
        f"  S bound from p2p_honest's α = {b['alpha']} at {b['mean_draft_length']} draft tokens per round, "
        f"c = {b['c']}, v = {b['v']}: {b['bound']}"
    )
    for name, value in t["ratios"].items():
        aim = t["aims"].get(name)
        verdict = f"  (aim ≥ {aim['aim']}: {'met' if aim['met'] else 'NOT met'})" if aim else ""
        print(f"  {name.replace('_vs_', ' / ')}: {value}{verdict}")
    f, m = t["first_job"], t["hostile"]
    print(
        f"  hostile first job: {f['wall_seconds']} s vs plain {f['plain_wall_seconds']} s (×{f['slowdown_vs_plain']}),"
        f" {f['draft_rounds']} rounds, {f['draft_empty_rounds']} empty, {f['draft_wait_seconds']} s waiting;"
        f" {m['benched_at_least_once']}/{len(m['drafters'])} hostile drafters benched so far, {m['benched_now']} now"
    )


def _print_report(report: dict, cfg: P2PBenchConfig) -> None:
    c = report["costs"]
    print(
        f"\ncosts: t_target(1)={c['t_target_1_ms']:.2f} ms  t_target(γ+1)={c['t_target_gamma1_ms']:.2f} ms  "
        f"t_draft(1)={c['t_draft_1_ms']:.2f} ms; target torch threads {report['target_torch_threads']}, drafter "
        f"processes OMP_NUM_THREADS={CHILD_ENV['OMP_NUM_THREADS']}; OMP_WAIT_POLICY {report['omp_wait_policy']}; "
        f"load average at start {report['load_average']}"
    )
    for t in report["temperatures"]:
        _print_temperature(t, cfg)
    print("\nhostile drafters at the end: jobs, rounds in time, timeouts, errors, benches, last reason")
    for name, r in report["market"]["hostile"]["drafters"].items():
        reason = r["bench_reason"] or r["last_error"]
        row = f"{r['jobs']:>4}{r['rounds']:>6}{r['timeouts']:>4}{r['errors']:>4}{r['bench_count']:>3}"
        print(f"  {name:<12}{row}  {reason[:70]}")
    for name in ("honest", "honest_no_overlap"):
        row = report["market"][name]["drafters"].get(name, {})
        print(f"{name} drafter: latency EWMA {row.get('latency_ms')} ms, benches {row.get('bench_count')}")
    print(f"\nwall time {report['wall_seconds']:.0f} s")


def _engines(pair: ModelPair, cfg: P2PBenchConfig, market: Market) -> dict[str, Engine]:
    return {
        "plain": Engine(pair, model_name="bench-plain", gamma=cfg.gamma, drafting=None),
        "local": Engine(pair, model_name="bench-local", gamma=cfg.gamma, drafting=LocalDrafting(pair.draft)),
        **{mode: market.targets[name].engine for name, mode in TARGETS.items()},
    }


def run_bench_p2p(cfg: P2PBenchConfig) -> dict:
    import torch  # imported when benchmarking, not at CLI start-up

    started, load = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    target_cores, drafter_cores = core_split()
    if target_cores is not None:  # the targets (this process) on one core, the drafter processes on the rest
        os.sched_setaffinity(0, target_cores)
    torch.set_num_threads(len(target_cores) if target_cores is not None else 2)
    pair = load_lab_pair(cfg.pair)
    workload = WORKLOADS[cfg.pair]
    prompts = [prompt_ids(pair.tokenizer, p, workload.chat) for p in workload.bench[: cfg.prompts]]
    costs = measure_costs(pair, cfg.gamma)
    with (
        sigterm_unwinds(),
        tempfile.TemporaryDirectory(prefix="bench_p2p_") as tmp,
        running_market(pair, cfg, Path(tmp), drafter_cores) as market,
    ):
        engines = _engines(pair, cfg, market)
        temps = [bench_temperature(pair, prompts, cfg, market, engines, t, costs) for t in cfg.temperatures]
        snapshots = {name: market_snapshot(market, node) for name, node in market.targets.items()}
        progress("stopping drafters and targets")
    report = {
        **{k: v for k, v in vars(cfg).items() if k != "out"},
        "prompts": len(prompts),
        "max_drafters": market.targets["hostile"].cfg.max_drafters,
        "hostile_strategies": list(HOSTILE),
        "slow_ms": DEFAULT_SLOW_MS,
        "drafter_env": CHILD_ENV,
        "target_torch_threads": torch.get_num_threads(),
        "cores": {"targets": sorted(os.sched_getaffinity(0)), "drafters": sorted(drafter_cores or [])},
        "load_average": load,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (spinning)"),
        "costs": {k: round(v, 4) for k, v in costs.items()},
        "temperatures": temps,
        "market": snapshots,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    _print_report(report, cfg)
    write_json(cfg.out, report)
    mismatches = [(t["temperature"], m["mode"], m["repeat"], m["prompt"]) for t in temps for m in t["mismatches"]]
    if mismatches:
        raise AssertionError(f"speculative output differs from plain decoding (T, mode, repeat, prompt): {mismatches}")
    return report
