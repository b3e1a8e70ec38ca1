"""``specmarket bench-serve``: a target node serving 1, 2, 4 and 8 concurrent clients, six ways.

Modes, each in the same run, on the qwen2.5-coder pair and the served kernel:
- ``plain``: no drafts, every job's passes its own (``--batch-rows 0``);
- ``plain-batched``: no drafts, concurrent jobs share passes (node.target.batching);
- ``spec``: each job drafts with its own fork of the 0.5B draft, its passes its own;
- ``spec-batched``: the same, with shared passes;
- ``remote`` and ``remote-batched``: the same drafts, drafted beforehand (recorded by the ``spec``
  run: the same prompt and context give the same greedy draft), so the target's two cores do the
  target's work only, as with drafter peers on machines of their own (the network's latency aside).
The ``spec`` modes' drafts run in this process, on the same two cores as the target; the
``remote`` ones show what batching does for the target itself. Clients send chat and code prompts
(64 tokens, greedy, different seeds) at once. For each mode and client count: aggregate tokens/s
(all tokens over the run's wall time) and the p50 and p95 latency per token (the engine's
inter-token samples, as the HTTP API's histograms get them; a chunk's gap is shared among its
tokens). Every mode's outputs must equal plain decoding's.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import trio
from tqdm import tqdm

from node.lab.bench_local import load_lab_pair, write_json
from node.lab.workload import QWEN_PROMPTS, prompt_ids
from node.model.kernels import cpu_summary
from node.target.config import DEFAULT_BATCH_ROWS
from node.target.engine import CompletionRequest, Engine
from verifier.proposers import LocalDraftProposer

log = logging.getLogger(__name__)

MODES = ("plain", "plain-batched", "spec", "spec-batched", "remote", "remote-batched")
CLIENTS = (1, 2, 4, 8)
THROUGHPUT_GOAL = 2.5  # spec-batched / spec at 4 clients, aggregate tokens/s
P95_GOAL = 1.6  # spec-batched at 4 clients / at 1 client, p95 latency per token
PLAIN_PASS_PRIOR_S = 0.25  # the engine's prior for a plain step (its wait budget's); each job measures its own


class _Draft:
    """A job's in-process drafter: the draft model's own fork (an engine ``JobProposer``), keeping
    every draft in ``drafts`` by its context; or, with ``replay``, answering from there."""

    name = "draft"

    def __init__(self, draft, drafts: dict[tuple[int, ...], object], replay: bool) -> None:
        self.inner, self.drafts, self.replay = LocalDraftProposer(draft.fork()), drafts, replay

    def propose(self, context, **kwargs):
        key = (kwargs["gamma"], *context)
        if self.replay and key in self.drafts:
            return self.drafts[key]
        self.drafts[key] = proposal = self.inner.propose(context, **kwargs)
        return proposal

    def finish(self, context) -> dict[str, int]:
        return {}

    def timing(self) -> dict[str, float]:
        return {}


class LocalDrafting:
    """A ``DraftingBackend`` giving every job a fork of the local draft model (``replay``: drafts
    recorded by an earlier run with ``drafts``, where it has them)."""

    def __init__(self, draft, drafts: dict, replay: bool = False) -> None:
        self.draft, self.drafts, self.replay = draft, drafts, replay

    @asynccontextmanager
    async def job(self, job_id, params, seed, gamma, max_tokens):
        yield _Draft(self.draft, self.drafts, self.replay)


class Latencies:
    """A ``JobObserver`` keeping every inter-token sample."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    def first_token(self, seconds: float) -> None:
        pass

    def inter_token(self, seconds: float) -> None:
        self.samples.append(seconds)

    def draft_wait(self, seconds: float) -> None:
        pass


async def _serve(engine: Engine, requests: list[CompletionRequest]) -> tuple[float, list[tuple[int, ...]]]:
    out: list = [None] * len(requests)

    async def one(i: int) -> None:
        out[i] = (await engine.complete(requests[i])).tokens

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(requests)):
            nursery.start_soon(one, i)
    return time.perf_counter() - started, out


def _run(pair, mode: str, requests: list[CompletionRequest], gamma: int, drafts: dict, batch_rows: int) -> dict:
    batched, plain = mode.endswith("batched"), mode.startswith("plain")
    drafting = None if plain else LocalDrafting(pair.draft, drafts, replay=mode.startswith("remote"))
    engine = Engine(
        pair, model_name="bench", gamma=gamma, batch_rows=batch_rows if batched else 0,
        drafting=drafting, max_jobs=len(requests), plain_pass_s=PLAIN_PASS_PRIOR_S,
    )  # fmt: skip
    latencies = Latencies()
    engine.observers.append(latencies)
    try:
        wall, outputs = trio.run(_serve, engine, requests)
    finally:
        engine.close()
    tokens = sum(len(o) for o in outputs)
    ms = np.array(latencies.samples) * 1000
    return {
        "outputs": [list(o) for o in outputs],
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 3),
        "p50_ms": round(float(np.percentile(ms, 50)), 1) if ms.size else 0.0,
        "p95_ms": round(float(np.percentile(ms, 95)), 1) if ms.size else 0.0,
        "batched_passes": engine.batcher.passes if engine.batcher is not None else 0,
    }


def run_bench_serve(
    *, tokens: int = 64, gamma: int = 4, clients=CLIENTS, batch_rows: int = DEFAULT_BATCH_ROWS, out: Path | None = None
) -> dict:
    import torch

    torch.set_num_threads(1)  # one thread a pass; concurrent passes (unbatched jobs, batcher threads) use the cores
    pair = load_lab_pair("qwen2.5-coder")
    prompts = [prompt_ids(pair.tokenizer, p, chat=True) for p in QWEN_PROMPTS]  # code, then chat
    drafts: dict = {}  # (γ, context) -> the draft: recorded by the spec modes, replayed by the remote ones
    table: dict[str, dict[str, dict]] = {}
    for n in clients:
        requests = [
            CompletionRequest(
                tuple(prompts[i % len(prompts)]), max_tokens=tokens, temperature=0.0, seed=i, ignore_eos=True
            )
            for i in range(n)
        ]
        runs = {
            mode: _run(pair, mode, requests, gamma, drafts, batch_rows)
            for mode in tqdm(MODES, desc=f"{n} client{'s' * (n > 1)}", unit="mode", file=sys.stderr)
        }
        reference = runs["plain"]["outputs"]
        table[str(n)] = {m: {k: v for k, v in r.items() if k != "outputs"} | {"identical": r["outputs"] == reference}
                         for m, r in runs.items()}  # fmt: skip
        _print_row(n, table[str(n)])
    report = {
        "cpu": cpu_summary(), "tokens": tokens, "gamma": gamma, "batch_rows": batch_rows, "clients": table,
        **_goals(table),
    }  # fmt: skip
    _print_goals(report)
    if out is not None:
        write_json(out / "bench_serve.json", report)
    return report


def _goals(table: dict) -> dict:
    if "4" not in table or "1" not in table:
        return {}
    four, one = table["4"], table["1"]
    out = {}
    for kind in ("spec", "remote"):
        batched, alone = four[f"{kind}-batched"], four[kind]
        out[f"{kind}_throughput_ratio_4"] = round(batched["tokens_per_s"] / alone["tokens_per_s"], 3)
        p95_one = max(one[f"{kind}-batched"]["p95_ms"], 1e-9)
        out[f"{kind}_p95_ratio_4_to_1"] = round(four[f"{kind}-batched"]["p95_ms"] / p95_one, 3)
    return out


def _print_row(n: int, row: dict) -> None:
    if n == CLIENTS[0]:
        print(f"{'clients':>7} {'mode':<14} {'tok/s':>7} {'p50 ms':>7} {'p95 ms':>7} {'passes':>6}  identical")
    for mode, r in row.items():
        print(
            f"{n:>7} {mode:<14} {r['tokens_per_s']:>7.2f} {r['p50_ms']:>7.1f} {r['p95_ms']:>7.1f} "
            f"{r['batched_passes']:>6}  {r['identical']}"
        )


def _print_goals(report: dict) -> None:
    for kind in ("spec", "remote"):
        if f"{kind}_throughput_ratio_4" in report:
            print(
                f"{kind}-batched / {kind} at 4 clients: {report[f'{kind}_throughput_ratio_4']:.2f}x tokens/s "
                f"(goal {THROUGHPUT_GOAL}); its p95 at 4 clients / 1 client: {report[f'{kind}_p95_ratio_4_to_1']:.2f} "
                f"(goal <= {P95_GOAL})"
            )
