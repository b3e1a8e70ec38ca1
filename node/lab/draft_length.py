"""`specmarket bench-draft-length`: how long a draft block should be, measured.

An honest drafter ends a block at the first token its draft model gives a probability below a
threshold, that token included, and at most γ tokens (node.drafter.session; HF transformers'
assisted generation does the same with ``assistant_confidence_threshold``). Which (γ, threshold)
wins depends on the pair: how often the draft's tokens match the target's, how well its confidence
predicts that, and what a draft token and a verification row cost.

Under Rule.GUMBEL whether a draft token is accepted is deterministic: it is accepted iff it equals
the target's own noisy argmax at that position. So one teacher-forced pass of each model over the
target's plain answer gives, for every position, (match, draft confidence): a *trace*. Any policy
replays exactly on it (the rounds it would run and the tokens each accepts), and costs come from
passes timed in the same run:

- *sequential*: in process, a round drafts its block, then verifies it: n·t_draft + t(n+1);
- *overlapped*: over the network, as the drafter peer does it: while the target verifies a block,
  the drafter drafts the predicted bonus and the next block (an early draft), which is used when
  the whole block and the bonus were right; otherwise the drafter drafts afresh after the verdict.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verifier.decode import decode_plain
from verifier.errors import InvalidParams
from verifier.model import score
from verifier.params import SamplingParams, token_probs
from verifier.proposers import GREEDY_CONFIDENCE
from verifier.verify import noisy_scores


@dataclass(frozen=True)
class Trace:
    """One answer: per output position, whether the draft's token is the target's, and the draft's
    probability of its own token (at T = 1 when greedy, as ``LocalDraftProposer`` reports it)."""

    matches: tuple[bool, ...]
    confidence: tuple[float, ...]


@dataclass(frozen=True)
class Costs:
    t1_s: float  # a one-position target pass
    draft_s: float  # one draft token
    transport_s: float  # one message's way over the network (a draft, or the verdict)
    verify: tuple[float, ...]  # verify[n]: a pass of n + 1 positions, in units of t1 (verify[0] = 1)

    def pass_s(self, drafted: int) -> float:
        return self.t1_s * self.verify[min(drafted, len(self.verify) - 1)]


def trace_of(pair, ids: list[int], params: SamplingParams, seed: int, max_tokens: int) -> Trace:
    out = list(decode_plain(pair.target.fork(), ids, params=params, seed=seed, max_new_tokens=max_tokens).tokens)
    return trace_over(pair.draft, ids, out, params, seed)


def trace_over(draft, ids: list[int], out: list[int], params: SamplingParams, seed: int) -> Trace:
    """The trace of the target's answer ``out`` to prompt ``ids``: one teacher-forced draft pass. With
    greedy params, the mean of its matches is the draft's greedy acceptance on that answer."""
    draft_rows = score(draft.fork(), ids, out[:-1])[0]  # [len(out), V]: row k drafts position k
    matches, confidence = [], []
    for k, row in enumerate(draft_rows):
        x = int(np.argmax(noisy_scores(row, params, seed, k)))
        probs = token_probs(row, params if not params.greedy else GREEDY_CONFIDENCE)
        matches.append(x == out[k])
        confidence.append(float(probs[x]))
    return Trace(tuple(matches), tuple(confidence))


def block_length(trace: Trace, begin: int, max_gamma: int, threshold: float) -> int:
    """The block drafted from position ``begin``: up to and including the first token below the
    threshold, at most ``max_gamma``, never past the answer's last position (as the decode loop caps
    a round at max_new_tokens - k - 1)."""
    end = min(begin + max_gamma, len(trace.matches) - 1)
    for i in range(begin, end):
        if trace.confidence[i] < threshold:
            return i - begin + 1
    return max(0, end - begin)


def accepted(trace: Trace, begin: int, n: int) -> int:
    a = 0
    while a < n and trace.matches[begin + a]:
        a += 1
    return a


def replay_sequential(trace: Trace, max_gamma: int, threshold: float, costs: Costs) -> tuple[float, int]:
    """(seconds, rounds) of in-process speculative decoding with this policy."""
    k, seconds, rounds = 0, 0.0, 0
    while k < len(trace.matches):
        n = block_length(trace, k, max_gamma, threshold)
        seconds += n * costs.draft_s + costs.pass_s(n)
        k, rounds = k + accepted(trace, k, n) + 1, rounds + 1
    return seconds, rounds


def replay_overlapped(trace: Trace, max_gamma: int, threshold: float, costs: Costs) -> tuple[float, int]:
    """(seconds, rounds) with a drafter peer that drafts the next block while a block is verified."""
    k, now, rounds = 0, 0.0, 0
    n = block_length(trace, 0, max_gamma, threshold)
    arrives = n * costs.draft_s + costs.transport_s  # the answer to the job's first message
    while k < len(trace.matches):
        done = max(now, arrives) + costs.pass_s(n)
        a = accepted(trace, k, n)
        following = k + a + 1
        n_next = block_length(trace, following, max_gamma, threshold) if following < len(trace.matches) else 0
        if a == n and following < len(trace.matches) and trace.matches[k + n]:
            arrives += (1 + n_next) * costs.draft_s + costs.transport_s  # early draft: bonus guess, then block
        else:  # the verdict reaches the drafter, which finishes the token in hand and drafts afresh
            arrives = max(done + costs.transport_s, arrives + costs.draft_s) + n_next * costs.draft_s
            arrives += costs.transport_s
        now, k, n, rounds = done, following, n_next, rounds + 1
    return now, rounds


def sweep(traces: Sequence[Trace], gammas, thresholds, costs: Costs) -> list[dict]:
    """Every (γ, threshold): tokens per pass and the speed-up over plain decoding, both replays."""
    tokens = sum(len(t.matches) for t in traces)
    plain_s = tokens * costs.t1_s
    rows = []
    for gamma in gammas:
        for threshold in thresholds:
            seq = [replay_sequential(t, gamma, threshold, costs) for t in traces]
            ovl = [replay_overlapped(t, gamma, threshold, costs) for t in traces]
            rows.append(
                {
                    "max_gamma": gamma,
                    "threshold": threshold,
                    "tokens_per_pass": round(tokens / sum(r for _, r in seq), 4),
                    "speedup_sequential": round(plain_s / sum(s for s, _ in seq), 4),
                    "speedup_overlapped": round(plain_s / sum(s for s, _ in ovl), 4),
                }
            )
    return rows


def measure_costs(pair, max_gamma: int, transport_ms: float) -> Costs:
    from node.lab.bench_local import pass_seconds

    t1 = pass_seconds(pair.target, 1)
    verify = tuple(1.0 if n == 0 else pass_seconds(pair.target, n + 1) / t1 for n in range(max_gamma + 1))
    return Costs(t1, pass_seconds(pair.draft, 1), transport_ms / 1000, verify)


def run_bench_draft_length(cfg) -> dict:
    """Traces of the pair's bench prompts, the costs timed now, and the sweep (``DraftLengthConfig``);
    with ``cfg.replay`` the traces and costs of that earlier output instead, swept again."""
    if cfg.replay is not None:
        earlier = json.loads(cfg.replay.read_text())
        traces = [Trace(tuple(t["matches"]), tuple(t["confidence"])) for t in earlier["traces"]]
        c = earlier["costs"]
        costs = Costs(c["t1_ms"] / 1e3, c["draft_ms"] / 1e3, cfg.transport_ms / 1e3, tuple(c["verify"]))
        if len(costs.verify) <= max(cfg.gammas):
            raise InvalidParams(f"{cfg.replay} timed passes of up to {len(costs.verify)} draft tokens only")
    else:
        traces, costs = _measure(cfg)
    positions = sum(len(t.matches) for t in traces)
    report = {
        "pair": cfg.pair if cfg.replay is None else earlier["pair"],
        "temperature": cfg.temperature if cfg.replay is None else earlier["temperature"],
        "answers": len(traces),
        "positions": positions,
        "match_rate": round(sum(sum(t.matches) for t in traces) / positions, 4),
        "costs": {"t1_ms": costs.t1_s * 1e3, "draft_ms": costs.draft_s * 1e3, "verify": costs.verify},
        "rows": sweep(traces, cfg.gammas, cfg.thresholds, costs),
        "traces": [{"matches": [int(m) for m in t.matches], "confidence": t.confidence} for t in traces],
    }
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    cfg.out.write_text(json.dumps(report) + "\n")
    _print(report)
    return report


def _measure(cfg) -> tuple[list[Trace], Costs]:
    import torch
    from tqdm import tqdm

    from node.lab.bench_local import load_lab_pair
    from node.lab.workload import WORKLOADS, prompt_ids

    torch.set_num_threads(1)  # as a target process serves
    pair = load_lab_pair(cfg.pair)
    workload = WORKLOADS[cfg.pair]
    params = SamplingParams(temperature=cfg.temperature)
    prompts = [prompt_ids(pair.tokenizer, p, workload.chat) for p in workload.bench[: cfg.prompts]]
    jobs = [(ids, seed) for i, ids in enumerate(prompts) for seed in range(i * cfg.seeds, (i + 1) * cfg.seeds)]
    progress = tqdm(jobs, desc="traces", unit="answer", file=sys.stderr)
    traces = [trace_of(pair, ids, params, seed, cfg.max_tokens) for ids, seed in progress]
    return traces, measure_costs(pair, max(cfg.gammas), cfg.transport_ms)


def _print(report: dict) -> None:
    c = report["costs"]
    print(
        f"{report['pair']}, T = {report['temperature']}: {report['answers']} answers, {report['positions']} positions, "
        f"draft match rate {report['match_rate']}; t(1) {c['t1_ms']:.1f} ms, draft {c['draft_ms']:.1f} ms/token, "
        f"v(n) {', '.join(f'{v:.3f}' for v in c['verify'][1:])}"
    )
    print(f"{'γ ≤':>4} {'threshold':>9} {'tokens/pass':>11} {'in process':>10} {'overlapped':>10}")
    for r in sorted(report["rows"], key=lambda r: -r["speedup_overlapped"]):
        print(
            f"{r['max_gamma']:>4} {r['threshold']:>9.2f} {r['tokens_per_pass']:>11.3f} "
            f"{r['speedup_sequential']:>9.3f}× {r['speedup_overlapped']:>9.3f}×"
        )
