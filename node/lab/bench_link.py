"""``specmarket bench-link``: who should draft across a slow link (issue 42 §2), measured side by side.

Three ways to ask the same target model, each through a userspace link on loopback
(node.lab.flaky_link) that delays every chunk by half the round trip, ± a tenth of it:
- ``plain``: plain `ask` to a target with no drafters (``--max-drafters 0``);
- ``client``: `ask --draft` to that same target: the client drafts for its own request with the
  pair's draft model, across the link (node.client.drafting);
- ``market``: plain `ask` to a target with one honest drafter peer beside it (on loopback, not
  across the link: the market's drafters sit near the target, the client is the far end).
Each ask is a `specmarket ask` process, as a user runs it. The targets run on the first core; the
drafter peer, the asks and the link (served from this process) on the others. The modes are
interleaved prompt by prompt at each round trip; every answer is checked token for token against
plain's. Speed is the job's: tokens / the target's wall time of the job, from the request to its last
token, the figure drafting changes (end to end, a client also pays its connection's set-up and one
more round trip, whatever the mode).

Where client drafting stops paying is the round trip from which `ask --draft` is no faster than plain
`ask` (``stops_paying``). "Speculation at a Distance" (2026, as issue 42 quotes it) gives the rule that
drafting at the client pays per request only while the round trip is below the drafting window; the
report prints the target's draft deadline (the most a round gives an answer) and the client's time
per answer at each round trip beside the crossover, so the two can be compared.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from node.lab.bench_local import write_json
from node.lab.config import LinkBenchConfig
from node.lab.flaky_link import FlakyLink, LinkConfig
from node.lab.procs import (
    CHILD_ENV,
    SPECMARKET,
    NodeProcess,
    ProcessFailed,
    ProcessGroup,
    core_split,
    start_drafter,
    start_target,
    wait_for_drafters,
)
from node.lab.trio_thread import TrioThread
from node.lab.workload import CODE_PROMPTS
from node.model.kernels import cpu_summary

MODES = ("plain", "client", "market")
LINK_JSON = "bench_link.json"
WARM_UP_JOBS = 3  # not measured: the market's drafter leaves probation, every model is warm
ASK_TIMEOUT_S = 600.0
DEADLINE_LINE = re.compile(r"draft deadline (\d+) ms")


def progress(message: str) -> None:
    print(f"[bench-link {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Asker:
    """Runs `specmarket ask` (with ``--draft`` for the client mode) as a user does, a process of its
    own on the client's cores, through a fresh FlakyLink per request served from this process."""

    def __init__(self, cfg: LinkBenchConfig, portal: TrioThread, cpus: frozenset[int] | None) -> None:
        self.cfg, self.portal, self.cpus = cfg, portal, cpus

    def ask(self, target: NodeProcess, prompt: str, seed: int, rtt_ms: float, draft: bool) -> dict:
        addr = target.lines["multiaddr"][0]
        host, port, peer = addr.split("/")[2], int(addr.split("/")[4]), addr.rsplit("/p2p/", 1)[1]
        link = FlakyLink((host, port), LinkConfig(rtt_ms / 2, rtt_ms / 10, seed=seed))
        link_port, stop = self.portal.start(link.serve)
        cfg = self.cfg
        args = [*SPECMARKET, "ask", "--target", f"/ip4/127.0.0.1/tcp/{link_port}/p2p/{peer}", "--pair", cfg.pair]
        args += [
            "--seed",
            str(seed),
            "--temperature",
            str(cfg.temperature),
            "--max-new-tokens",
            str(cfg.max_new_tokens),
        ]
        args += ["--ignore-eos", "--json", *(["--draft"] if draft else []), prompt]
        pin = None if self.cpus is None else partial(os.sched_setaffinity, 0, self.cpus)
        try:
            run = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **CHILD_ENV}, preexec_fn=pin,
                                 timeout=ASK_TIMEOUT_S, check=False)  # fmt: skip
        finally:
            stop()
        if run.returncode != 0:
            raise ProcessFailed(f"ask ({'--draft' if draft else 'plain'}) at {rtt_ms} ms failed:\n{run.stderr[-2000:]}")
        answer = json.loads(run.stdout)
        return {"tokens": answer["tokens"], "stats": answer["stats"]}


def _row(answers: list[dict]) -> dict:
    """One mode at one round trip: medians over its answers, and its drafting's totals."""
    stats = [a["stats"] for a in answers]
    tokens = [len(a["tokens"]) for a in answers]
    job_tps = [n / s["wall_seconds"] for n, s in zip(tokens, stats, strict=True)]
    drafted, accepted = (sum(s.get(k, 0) for s in stats) for k in ("client_draft_tokens", "client_tokens_accepted"))
    return {
        "job_tokens_per_s": round(statistics.median(job_tps), 2),
        "acceptance": round(statistics.median(s.get("acceptance_rate", 0.0) for s in stats), 3),
        "tokens_per_pass": round(sum(tokens) / max(1, sum(s.get("target_passes", 0) for s in stats)), 3),
        "early_hits": sum(s.get("draft_early_hits", 0) for s in stats),
        "client_draft_tokens": drafted,
        "client_tokens_accepted": accepted,
        "empty_rounds": sum(s.get("draft_empty_rounds", 0) for s in stats),
        "rounds": sum(s.get("draft_rounds", 0) for s in stats),
        "budget_stops": sum(s.get("draft_budget_stopped_at_round", -1) >= 0 for s in stats),
        "wait_ms_max": max((s.get("draft_wait_ms_max", 0.0) for s in stats), default=0.0),
        "client_ms_per_answer": round(
            statistics.median(s.get("draft_round_trip_ms_per_answer", 0.0) for s in stats), 1
        ),
    }


def _measure(cfg: LinkBenchConfig, asker: Asker, targets: dict[str, NodeProcess]) -> dict[int, dict[str, dict]]:
    """Every round trip; at each, the modes interleaved prompt by prompt; outputs checked against plain's."""
    table: dict[int, dict[str, dict]] = {}
    for rtt in cfg.rtts_ms:
        answers: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for i, prompt in enumerate(CODE_PROMPTS[: cfg.prompts] * cfg.repeats):
            for mode in MODES:
                target = targets["market" if mode == "market" else "plain"]
                answers[mode].append(asker.ask(target, prompt, cfg.seed + i, rtt, draft=mode == "client"))
            reference = answers["plain"][-1]["tokens"]
            for mode in MODES:
                if answers[mode][-1]["tokens"] != reference:
                    raise AssertionError(f"{mode} at {rtt} ms answered differently from plain decoding")
        table[rtt] = {mode: _row(answers[mode]) for mode in MODES}
        progress(f"{rtt} ms: " + ", ".join(f"{m} {table[rtt][m]['job_tokens_per_s']} tok/s" for m in MODES))
    return table


def _deadline_ms(target: NodeProcess) -> int | None:
    found = DEADLINE_LINE.search(target.log())
    return int(found.group(1)) if found else None


def _start(
    cfg: LinkBenchConfig, work: Path, group: ProcessGroup
) -> tuple[dict[str, NodeProcess], frozenset[int] | None]:
    """The two targets on the first core, the drafter peer on the others; and the client's cores."""
    target_cpus, other_cpus = core_split()
    budget = () if cfg.wait_budget is None else ("--wait-budget", str(cfg.wait_budget))
    options = {"plain": ("--max-drafters", "0", *budget), "market": ("--max-drafters", "1", *budget)}
    targets = {
        mode: start_target(work, *opts, name=f"target-{mode}", group=group, pair=cfg.pair, cpus=target_cpus)
        for mode, opts in options.items()
    }
    start_drafter(work, targets["market"].lines["multiaddr"][0], "honest", "drafter", group=group, pair=cfg.pair,
                  cpus=other_cpus)  # fmt: skip
    wait_for_drafters(targets["market"].lines["http"][0], 1)
    return targets, other_cpus


def print_report(report: dict) -> None:
    print(f"\nbench-link: {report['pair']}, {report['prompts']} prompts x {report['repeats']}, "
          f"{report['max_new_tokens']} tokens, T={report['temperature']}; {report['cpu']}")  # fmt: skip
    budget = "the targets' default" if report["wait_budget"] is None else report["wait_budget"]
    print(f"target draft deadline: {report['deadline_ms']} ms, wait budget {budget}; job tokens/s (tokens per pass)")
    print(f"{'RTT ms':>7} {'plain':>16} {'ask --draft':>16} {'market':>16} {'draft/plain':>12} {'market/plain':>13}")
    for rtt, row in report["table"].items():
        cells = [f"{row[m]['job_tokens_per_s']:>7.2f} ({row[m]['tokens_per_pass']:.2f})" for m in MODES]
        print(f"{rtt:>7} {cells[0]:>16} {cells[1]:>16} {cells[2]:>16} "
              f"{report['speedup'][rtt]['client']:>11.2f}x {report['speedup'][rtt]['market']:>12.2f}x")  # fmt: skip
    stops = report["client_stops_paying_at_ms"]
    print(
        f"client drafting stops paying at: {'not within the round trips measured' if stops is None else f'{stops} ms'}"
    )


def stops_paying(rtts_ms: tuple[int, ...], speedup: dict[int, float], accepted: dict[int, int]) -> int | None:
    """The least round trip from which client drafting pays at no longer one measured; None while it
    pays at the longest (or it never did: then the first). It pays where it is faster than plain and
    the target accepted some of its tokens (a job that drafted nothing is plain decoding, whatever the
    noise says)."""
    paying = [rtt for rtt in sorted(rtts_ms) if speedup[rtt] > 1.0 and accepted[rtt] > 0]
    if not paying:
        return min(rtts_ms)
    later = [rtt for rtt in sorted(rtts_ms) if rtt > paying[-1]]
    return later[0] if later else None


def _warm_up(asker: Asker, targets: dict[str, NodeProcess]) -> None:
    """Not measured: every mode once, and the market's drafter out of probation."""
    prompt = CODE_PROMPTS[-1]
    for i in range(WARM_UP_JOBS):
        asker.ask(targets["market"], prompt, 1000 + i, 0, draft=False)
    asker.ask(targets["plain"], prompt, 1000, 0, draft=False)
    asker.ask(targets["plain"], prompt, 1000, 0, draft=True)


def run_bench_link(cfg: LinkBenchConfig) -> dict:
    with tempfile.TemporaryDirectory(prefix="specmarket-bench-link-") as tmp, ProcessGroup() as group:
        progress("starting two targets and a drafter peer (each loads its models)")
        targets, client_cpus = _start(cfg, Path(tmp), group)
        portal = TrioThread()
        try:
            asker = Asker(cfg, portal, client_cpus)
            _warm_up(asker, targets)
            progress("measuring")
            table = _measure(cfg, asker, targets)
        finally:
            portal.close()
        deadline = _deadline_ms(targets["plain"])
    speedup = {
        rtt: {m: round(row[m]["job_tokens_per_s"] / row["plain"]["job_tokens_per_s"], 3) for m in ("client", "market")}
        for rtt, row in table.items()
    }
    accepted = {rtt: table[rtt]["client"]["client_tokens_accepted"] for rtt in cfg.rtts_ms}
    stops = stops_paying(cfg.rtts_ms, {rtt: speedup[rtt]["client"] for rtt in cfg.rtts_ms}, accepted)
    report = {
        "pair": cfg.pair, "cpu": cpu_summary(), "prompts": cfg.prompts, "repeats": cfg.repeats,
        "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "deadline_ms": deadline,
        "wait_budget": cfg.wait_budget,
        "table": table, "speedup": speedup, "client_stops_paying_at_ms": stops,
    }  # fmt: skip
    print_report(report)
    if cfg.out is not None:
        write_json(cfg.out / LINK_JSON, report)
    return report
