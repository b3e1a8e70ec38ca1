"""Measured points for the report's S-against-γ plot: the demo's pair decoded in this process, plain
and with the local (honest, in-process) drafter at several γ, on the demo's prompts and seeds.

In-process drafting has no network round trip, so these points show the same pair with a smaller
drafting cost c than the p2p run; each point's α comes from its own measured Ω (tokens per pass).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from node.model.decoding import GenerateConfig, run_decode
from node.model.loading import ModelPair
from verifier.decode import DecodeResult
from verifier.errors import InvalidParams
from verifier.params import SamplingParams
from verifier.theory import alpha_from_omega

SWEEP_GAMMAS = (1, 2, 4, 8)
SWEEP_REPEATS = 3  # interleaved; the fastest of each is kept (timeit's rule: slower runs are noise)
SWEEP_THREADS = 1  # as the target processes run (procs.CHILD_ENV): the same cost model on both sides


def _decode(pair: ModelPair, cfg: GenerateConfig, prompt_ids: list[int]) -> tuple[DecodeResult, float]:
    """One timed generation from fresh caches (as `generate`, keeping the per-round stats)."""
    pair.target.reset()
    if pair.draft is not None:
        pair.draft.reset()
    started = time.perf_counter()
    result = run_decode(pair, cfg, prompt_ids)
    return result, time.perf_counter() - started


def _run(pair: ModelPair, base: GenerateConfig, prompts: Sequence[list[int]], **changes) -> dict:
    runs = [_decode(pair, replace(base, seed=i, **changes), ids) for i, ids in enumerate(prompts)]
    return {
        "tokens": sum(len(r.tokens) for r, _ in runs),
        "wall_seconds": sum(wall for _, wall in runs),
        "target_passes": sum(r.stats.target_passes for r, _ in runs),
        "outputs": [list(r.tokens) for r, _ in runs],
        "tokens_per_round": [n + 1 for r, _ in runs for n in r.stats.accepted_per_round],
    }


def measured_alpha(omega: float, gamma: int) -> float:
    """The i.i.d. acceptance rate that explains a measured Ω at γ (0 for a run without passes)."""
    try:
        return alpha_from_omega(min(omega, gamma + 1.0), gamma)
    except InvalidParams:
        return 0.0


def _configs(gammas: Sequence[int]) -> dict[int, dict]:
    """γ -> generate overrides; γ = 0 is plain decoding."""
    return {0: {"drafter": "none"}, **{g: {"drafter": "honest", "gamma": g} for g in gammas}}


def local_sweep(
    pair: ModelPair,
    prompts: Sequence[list[int]],
    max_tokens: int,
    temperature: float,
    gammas: Sequence[int] = SWEEP_GAMMAS,
    repeats: int = SWEEP_REPEATS,
) -> list[dict]:
    """One {gamma, alpha, omega, speedup, identical, tokens_per_round} point per γ, on prompt token
    ids; the speed-up is against plain decoding, each configuration timed SWEEP_REPEATS times
    interleaved, best run kept."""
    threads = torch.get_num_threads()
    torch.set_num_threads(SWEEP_THREADS)
    params = SamplingParams(temperature=temperature)
    # the pair is given, loaded; every run the same length, as the sweep compares times per token
    base = GenerateConfig(prompt="", max_new_tokens=max_tokens, params=params, ignore_eos=True)
    best: dict[int, dict] = {}
    try:
        for _ in range(repeats):
            for g, changes in _configs(gammas).items():
                run = _run(pair, base, prompts, **changes)
                if g not in best or run["wall_seconds"] < best[g]["wall_seconds"]:
                    best[g] = run
    finally:
        torch.set_num_threads(threads)
    plain = best.pop(0)
    return [
        {
            "gamma": g,
            "alpha": round(measured_alpha(run["tokens"] / run["target_passes"], g), 4),
            "omega": round(run["tokens"] / run["target_passes"], 4),
            "speedup": round(plain["wall_seconds"] / run["wall_seconds"], 4),
            "identical": run["outputs"] == plain["outputs"],
            "tokens_per_round": run["tokens_per_round"],  # emitted per target pass, in order
        }
        for g, run in best.items()
    ]
