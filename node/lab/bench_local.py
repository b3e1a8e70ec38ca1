"""Local benchmark: plain vs specmarket speculative (GUMBEL, LEVIATHAN) vs HF assisted generation.

Everything is measured in one process, one run, same prompts, same pair; ratios are printed side by
side. Aims (not tests): specmarket speculative tok/s >= HF assisted; GUMBEL match >= 0.85 Σmin(p,q).
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from node.lab.config import BenchConfig
from node.lab.workload import WORKLOADS, prompt_ids
from node.model.adapter import HFCausalLM
from node.model.loading import ModelPair, load_pair
from verifier.decode import DecodeResult, DecodeStats, decode
from verifier.params import SamplingParams, token_probs
from verifier.proposers import LocalDraftProposer
from verifier.theory import alpha_from_omega, expected_tokens, speedup
from verifier.verify import Rule, noisy_scores, sample_token

TIMING_REPEATS = 30
HF_ASSISTED = ("hf_assisted_constant", "hf_assisted_heuristic")
COST_CONTEXT = 64  # context length at which single-pass costs are timed


def time_runs(fn: Callable[[list[int], int], list[int]], prompts: list[list[int]]) -> tuple[float, list[list[int]]]:
    outputs, tokens, started = [], 0, time.perf_counter()
    for seed, ids in enumerate(prompts):
        out = fn(ids, seed)
        outputs.append(out)
        tokens += len(out)
    return tokens / (time.perf_counter() - started), outputs


def _specmarket_mode(pair, params, cfg, rule: Rule | None, results: list[DecodeResult]):
    def run(ids: list[int], seed: int) -> list[int]:
        pair.target.reset()
        pair.draft.reset()
        proposer = None if rule is None else LocalDraftProposer(pair.draft)
        res = decode(
            pair.target,
            proposer,
            ids,
            params=params,
            seed=seed,
            max_new_tokens=cfg.max_new_tokens,
            gamma=cfg.gamma,
            rule=rule or Rule.GUMBEL,
        )
        results.append(res)
        return list(res.tokens)

    return run


@functools.cache
def _hf_from_packed(directory: Path):
    from node.model.packed import to_hf_model

    return to_hf_model(directory)


def hf_model(lm):
    """The transformers model behind ``lm``: its own, or for a packed model (node.model.packed) one
    built once from the same float16 values."""
    return lm.model if hasattr(lm, "model") else _hf_from_packed(lm.weights.directory)


def has_hf_model(lm) -> bool:
    """Whether transformers can run ``lm``'s model: an HF model, or a packed one (its float16 values).
    An exact target (node.model.exact) has none: its arithmetic is its integers, which transformers
    does not compute, so the HF baselines are left out for it (the anchor is llama.cpp: bench-anchor)."""
    if hasattr(lm, "model"):
        return True
    from node.model.packed import is_packed_model

    directory = getattr(getattr(lm, "weights", None), "directory", None)
    return directory is not None and is_packed_model(directory)


def hf_modes(pair, params, cfg) -> dict:
    """transformers' plain and assisted generation of the pair (none where the target has no HF model)."""
    if not (has_hf_model(pair.target) and has_hf_model(pair.draft)):
        return {}
    return {
        "hf_plain": hf_mode(pair, params, cfg, assisted=False, schedule="constant"),
        **{name: hf_mode(pair, params, cfg, assisted=True, schedule=name.rsplit("_", 1)[-1]) for name in HF_ASSISTED},
    }


def hf_mode(pair, params, cfg, assisted: bool, schedule: str):
    import torch  # imported when benchmarking, not at CLI start-up

    def run(ids: list[int], seed: int) -> list[int]:
        torch.manual_seed(seed)
        kwargs = dict(
            max_new_tokens=cfg.max_new_tokens,
            min_new_tokens=cfg.max_new_tokens,
            pad_token_id=pair.tokenizer.eos_token_id,
        )
        if params.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_k=0)
        if assisted:
            draft = hf_model(pair.draft)
            draft.generation_config.num_assistant_tokens = cfg.gamma
            draft.generation_config.num_assistant_tokens_schedule = schedule
            kwargs["assistant_model"] = draft
        input_ids = torch.tensor([ids])
        with torch.inference_mode():
            out = hf_model(pair.target).generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        return out[0, len(ids) :].tolist()

    return run


def _summarise(results: list[DecodeResult]) -> dict:
    stats = DecodeStats.merged([r.stats for r in results])
    return {
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "mean_accepted_length": round(stats.mean_accepted_length, 4),
        "target_passes": stats.target_passes,
    }


def median_seconds(fn: Callable[[], object], repeats: int = TIMING_REPEATS) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def pass_seconds(model: HFCausalLM, n: int, repeats: int = TIMING_REPEATS) -> float:
    """Median seconds of one n-position pass on a warm cache of COST_CONTEXT tokens (then rolled back)."""
    model.reset()
    model.extend(list(range(1, COST_CONTEXT + 1)))

    def once() -> None:
        model.extend(list(range(7, 7 + n)))
        model.rollback(n)

    return median_seconds(once, repeats)


def measure_costs(pair: ModelPair, gamma: int) -> dict:
    """t_target(1), t_target(γ+1), t_draft(1) with a warm cache of COST_CONTEXT tokens."""
    t1, tg, td = pass_seconds(pair.target, 1), pass_seconds(pair.target, gamma + 1), pass_seconds(pair.draft, 1)
    return {
        "t_target_1_ms": t1 * 1e3,
        "t_target_gamma1_ms": tg * 1e3,
        "t_draft_1_ms": td * 1e3,
        "cost_c": td / t1,
        "verify_cost_v": tg / t1,
    }


def coupling_quality(pair: ModelPair, prompts: list[list[int]], plain_outputs: list[list[int]]) -> dict:
    """At T=1 along plain-decoded text: Σmin(p,q) (Leviathan optimum), Σp·q (independent
    sampling) and the measured GUMBEL match rate P[x_k == y_k] with shared noise."""
    params = SamplingParams(temperature=1.0)
    sum_min, sum_pq, matches, n = 0.0, 0.0, 0, 0
    for seed, (ids, out) in enumerate(zip(prompts, plain_outputs, strict=True)):
        seq = [*ids, *out]
        target_rows = pair.target.fork().extend(seq)  # [len(seq), V]
        draft_rows = pair.draft.fork().extend(seq)
        for k in range(len(out)):
            pos = len(ids) - 1 + k
            p, q = token_probs(target_rows[pos], params), token_probs(draft_rows[pos], params)
            sum_min += float(np.minimum(p, q).sum())
            sum_pq += float((p * q).sum())
            y = sample_token(target_rows[pos], params, seed, k)
            matches += int(np.argmax(noisy_scores(draft_rows[pos], params, seed, k)) == y)
            n += 1
    return {
        "sum_min_pq": sum_min / n,
        "sum_p_times_q": sum_pq / n,
        "gumbel_match_rate": matches / n,
        "match_over_optimum": (matches / n) / (sum_min / n),
        "positions": n,
    }


def _modes(pair, params, cfg, sink: dict[str, list[DecodeResult]]):
    return {
        "plain": _specmarket_mode(pair, params, cfg, None, sink.setdefault("plain", [])),
        "specmarket_gumbel": _specmarket_mode(pair, params, cfg, Rule.GUMBEL, sink.setdefault("specmarket_gumbel", [])),
        "specmarket_leviathan": _specmarket_mode(
            pair, params, cfg, Rule.LEVIATHAN, sink.setdefault("specmarket_leviathan", [])
        ),
        **hf_modes(pair, params, cfg),
    }


def bench_temperature(pair, prompts, cfg: BenchConfig, temperature: float, costs: dict) -> dict:
    params = SamplingParams(temperature=temperature)
    sink: dict[str, list[DecodeResult]] = {}
    rows, outputs = {}, {}
    modes = _modes(pair, params, cfg, sink)
    for fn in modes.values():
        fn(prompts[0], 0)  # warm-up (first-call allocations, HF generate set-up)
    samples: dict[str, list[float]] = {name: [] for name in modes}
    for _ in tqdm(range(cfg.repeats), desc=f"T={temperature}", unit="repeat", leave=False):
        for name, fn in modes.items():  # interleaved, so drift in machine speed hits every mode alike
            sink.get(name, []).clear()
            tps, outputs[name] = time_runs(fn, prompts)
            samples[name].append(tps)
    for name in modes:
        rows[name] = {
            "tokens_per_second": round(statistics.median(samples[name]), 2),
            **(_summarise(sink[name]) if name in sink else {}),
        }
    for row in rows.values():
        row["speedup_vs_plain"] = round(row["tokens_per_second"] / rows["plain"]["tokens_per_second"], 3)
    gumbel = rows["specmarket_gumbel"]
    alpha = alpha_from_omega(min(gumbel["mean_accepted_length"], cfg.gamma + 1), cfg.gamma)
    bound = speedup(alpha, cfg.gamma, costs["cost_c"], costs["verify_cost_v"])
    return {
        "temperature": temperature,
        "modes": rows,
        "gumbel_identical_to_plain": sum(
            a == b for a, b in zip(outputs["specmarket_gumbel"], outputs["plain"], strict=True)
        ),
        "prompts": len(prompts),
        "alpha_hat": round(alpha, 4),
        "omega_at_alpha_hat": round(expected_tokens(alpha, cfg.gamma), 4),
        "S_bound": round(bound, 3),
        "plain_outputs": outputs["plain"],
    }


def _print_report(report: dict) -> None:
    c = report["costs"]
    print(
        f"\ncosts: t_target(1)={c['t_target_1_ms']:.2f} ms  t_target(γ+1)={c['t_target_gamma1_ms']:.2f} ms  "
        f"t_draft(1)={c['t_draft_1_ms']:.2f} ms  c={c['cost_c']:.3f}  v={c['verify_cost_v']:.3f}"
    )
    for t in report["temperatures"]:
        print(
            f"\nT={t['temperature']}  (γ={report['gamma']}, α̂={t['alpha_hat']}, S bound={t['S_bound']}, "
            f"GUMBEL == plain on {t['gumbel_identical_to_plain']}/{t['prompts']} prompts)"
        )
        print(f"  {'mode':<24}{'tok/s':>9}{'vs plain':>10}{'accept':>9}{'tok/pass':>10}")
        for name, row in t["modes"].items():
            print(
                f"  {name:<24}{row['tokens_per_second']:>9}{row['speedup_vs_plain']:>10}"
                f"{row.get('acceptance_rate', ''):>9}{row.get('mean_accepted_length', ''):>10}"
            )
        m = t["modes"]
        if all(h in m for h in HF_ASSISTED):
            best = max(m[h]["tokens_per_second"] for h in HF_ASSISTED)
            print(f"  specmarket GUMBEL / best HF assisted: {m['specmarket_gumbel']['tokens_per_second'] / best:.3f}")
    q = report["coupling_T1"]
    print(
        f"\ncoupling at T=1: Σmin(p,q)={q['sum_min_pq']:.3f}  Σp·q={q['sum_p_times_q']:.3f}  "
        f"GUMBEL match={q['gumbel_match_rate']:.3f}  (= {q['match_over_optimum']:.3f} × optimum)"
    )


def load_lab_pair(name: str) -> ModelPair:
    """A named pair with the draft, its target on the kernel target nodes serve with (node.model.kernels)."""
    from node.model.kernels import DEFAULT_KERNEL
    from node.model.pairs import get_pair

    named = get_pair(name)
    return load_pair(named.target_dir(), named.draft_dir(), DEFAULT_KERNEL)


def run_bench(cfg: BenchConfig) -> dict:
    import torch

    torch.set_num_threads(2)
    pair = load_lab_pair(cfg.pair)
    workload = WORKLOADS[cfg.pair]
    prompts = [prompt_ids(pair.tokenizer, p, workload.chat) for p in workload.bench]
    costs = measure_costs(pair, cfg.gamma)
    temps = [bench_temperature(pair, prompts, cfg, t, costs) for t in cfg.temperatures]
    t1 = next((t for t in temps if t["temperature"] == 1.0), None)
    plain_t1 = t1["plain_outputs"] if t1 else time_runs(_modes(pair, SamplingParams(), cfg, {})["plain"], prompts)[1]
    report = {
        "gamma": cfg.gamma,
        "repeats": cfg.repeats,
        "max_new_tokens": cfg.max_new_tokens,
        "costs": {k: round(v, 4) for k, v in costs.items()},
        "temperatures": [{k: v for k, v in t.items() if k != "plain_outputs"} for t in temps],
        "coupling_T1": coupling_quality(pair, prompts, plain_t1),
        "measured_points": [
            {
                "gamma": cfg.gamma,
                "alpha": t["alpha_hat"],
                "speedup": t["modes"]["specmarket_gumbel"]["speedup_vs_plain"],
                "temperature": t["temperature"],
            }
            for t in temps
        ],
    }
    _print_report(report)
    write_json(cfg.out, report)
    return report


def write_json(out: Path, report: dict) -> None:
    """A benchmark's JSON report, and the line that says where it went."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}")
