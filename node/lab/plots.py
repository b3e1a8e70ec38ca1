"""PNG plots for `specmarket theory` and the demo's report."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from verifier.errors import SpecmarketError
from verifier.theory import expected_tokens, simulate_rounds, speedup

GAMMA_AXIS = range(1, 13)
BAR_WIDTH = 0.27


def plot_omega_convergence(
    alphas: list[float],
    gamma: int,
    rounds: int,
    path: Path,
    measured_omega: float | None = None,
    measured_rounds: list[int] | None = None,
) -> Path:
    """Running mean of simulated accepted lengths against Ω(α, γ). From a run: ``measured_rounds``
    (tokens emitted per target pass, in order) as a running mean, ``measured_omega`` as a dotted line."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, alpha in enumerate(alphas):
        sim = simulate_rounds(alpha, gamma, rounds, seed=i)
        line = ax.plot(range(1, rounds + 1), sim.running_mean, label=f"simulated, α={alpha:.3g}")[0]
        ax.axhline(expected_tokens(alpha, gamma), color=line.get_color(), ls="--", lw=1)
    if measured_rounds:
        mean = np.cumsum(measured_rounds) / np.arange(1, len(measured_rounds) + 1)
        ax.plot(range(1, len(mean) + 1), mean, color="black", lw=1.5, label="measured, in-process drafter")
    if measured_omega is not None:
        ax.axhline(
            measured_omega, color="black", ls=":", lw=1.5, label=f"measured, p2p: {measured_omega:.2f} tokens/pass"
        )
    ax.set_xscale("log")
    title = f"Empirical mean accepted length → Ω(α, γ={gamma}) (dashed)"
    return _finish(fig, ax, "round", "mean tokens per target pass", title, path)


def _finish(fig, ax, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _measured_points(path: Path | list[dict] | None) -> list[dict]:
    """Measured {gamma, alpha, speedup} points: a list, or a benchmark JSON with ``measured_points``."""
    if path is None:
        return []
    if isinstance(path, list):
        return path
    try:
        points = json.loads(Path(path).read_text())["measured_points"]
    except (OSError, ValueError, KeyError) as exc:
        raise SpecmarketError(f"{path} is not a benchmark JSON with measured_points: {exc}") from exc
    return [p for p in points if {"gamma", "alpha", "speedup"} <= p.keys()]


def plot_speedup(
    alphas: list[float],
    cost: float,
    path: Path,
    measured: Path | list[dict] | None = None,
    verify_cost: float = 1.0,  # a verification pass's time in plain target passes (theory: 1)
) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for alpha in alphas:
        values = [speedup(alpha, g, cost, verify_cost) for g in GAMMA_AXIS]
        line = ax.plot(list(GAMMA_AXIS), values, marker=".", label=f"α={alpha:.3g}")[0]
        best = max(GAMMA_AXIS, key=lambda g: (speedup(alpha, g, cost, verify_cost), -g))
        ax.plot([best], [speedup(alpha, best, cost, verify_cost)], marker="*", ms=14, color=line.get_color())
    for point in _measured_points(measured):
        ax.plot([point["gamma"]], [point["speedup"]], "kx", ms=10, mew=2)
        ax.annotate(f"measured α={point['alpha']:.2f}", (point["gamma"], point["speedup"]), fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8)
    v = "" if verify_cost == 1.0 else f", v = {verify_cost:.3g}"
    title = f"Speed-up bound, c = {cost:.3g}{v} (★ optimum, × measured)"
    return _finish(fig, ax, "γ (draft tokens per round)", "S = Ω / (γc + v)", title, path)


def write_theory_plots(alphas, cost, gamma, rounds, out: Path, measured: Path | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_omega_convergence(list(alphas), gamma, rounds, out / "omega_convergence.png"),
        plot_speedup(list(alphas), cost, out / "speedup_vs_gamma.png", measured),
    ]


def plot_drafter_acceptance(drafters: list[dict], path: Path) -> Path:
    """Draft tokens proposed, matched and accepted (credited) per drafter peer."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = [d["name"] for d in drafters]
    x = np.arange(len(names))
    for i, (key, label) in enumerate((("proposed", "proposed"), ("matched", "matched"), ("accepted", "accepted"))):
        ax.bar(x + (i - 1) * BAR_WIDTH, [d[key] for d in drafters], BAR_WIDTH, label=label)
    ax.set_xticks(x, names, rotation=15)
    return _finish(fig, ax, "drafter peer", "draft tokens", "Per-drafter draft tokens (with speculation)", path)


def plot_with_without(rows: dict[str, dict], path: Path) -> Path:
    """Tokens/s, target passes and target positions per output token, with and without speculation."""
    metrics = (("tokens_per_second", "tokens/s"), ("target_passes", "target passes"))
    metrics += (("positions_per_token", "positions / token"),)
    fig, axes = plt.subplots(1, len(metrics), figsize=(10, 4))
    for ax, (key, label) in zip(axes, metrics, strict=True):
        values = [rows[mode][key] for mode in rows]
        ax.bar(list(rows), values, color=["tab:blue", "tab:grey"])
        ax.set_title(label)
        for i, v in enumerate(values):
            ax.annotate(f"{v:g}", (i, v), ha="center", va="bottom", fontsize=9)
    fig.suptitle("Same answers, with and without speculation")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedup_measured(fit: dict, local_points: list[dict], path: Path) -> Path:
    """The p2p run's S(γ) = Ω(α, γ) / (γc + v) with its measured point, and the speed-ups measured
    with the in-process drafter at several γ (same pair, prompts and seeds)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    alpha, cost, verify = fit["alpha"], fit["cost"], fit["verify_cost"]
    curve = [speedup(alpha, g, cost, verify) for g in GAMMA_AXIS]
    label = f"theory, p2p: α={alpha:.2f}, c={cost:.2f}, v={verify:.2f}"
    line = ax.plot(list(GAMMA_AXIS), curve, marker=".", label=label)[0]
    ax.plot([fit["gamma"]], [fit["speedup"]], "x", ms=11, mew=2.5, color=line.get_color(), label="measured, p2p")
    if local_points:
        gammas = [p["gamma"] for p in local_points]
        ax.plot(gammas, [p["speedup"] for p in local_points], "s--", color="tab:green", label="measured, in-process")
        for p in local_points:
            ax.annotate(
                f"α={p['alpha']:.2f}", (p["gamma"], p["speedup"]), fontsize=8, xytext=(4, 4), textcoords="offset points"
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    title = "Speed-up against γ (× and ■ measured in this run)"
    return _finish(fig, ax, "γ (draft tokens per round)", "S = plain wall time / speculative", title, path)
