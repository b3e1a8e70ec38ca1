"""PNG plots for `specmarket theory` (and, later, the report)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from verifier.errors import SpecmarketError
from verifier.theory import expected_tokens, optimal_gamma, simulate_rounds, speedup

GAMMA_AXIS = range(1, 13)


def plot_omega_convergence(alphas: list[float], gamma: int, rounds: int, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, alpha in enumerate(alphas):
        sim = simulate_rounds(alpha, gamma, rounds, seed=i)
        line = ax.plot(range(1, rounds + 1), sim.running_mean, label=f"simulated, α={alpha}")[0]
        ax.axhline(expected_tokens(alpha, gamma), color=line.get_color(), ls="--", lw=1)
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


def _measured_points(path: Path | None) -> list[dict]:
    if path is None:
        return []
    try:
        points = json.loads(Path(path).read_text())["measured_points"]
    except (OSError, ValueError, KeyError) as exc:
        raise SpecmarketError(f"{path} is not a benchmark JSON with measured_points: {exc}") from exc
    return [p for p in points if {"gamma", "alpha", "speedup"} <= p.keys()]


def plot_speedup(alphas: list[float], cost: float, path: Path, measured: Path | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for alpha in alphas:
        values = [speedup(alpha, g, cost) for g in GAMMA_AXIS]
        line = ax.plot(list(GAMMA_AXIS), values, marker=".", label=f"α={alpha}")[0]
        best = optimal_gamma(alpha, cost, max(GAMMA_AXIS))
        ax.plot([best], [speedup(alpha, best, cost)], marker="*", ms=14, color=line.get_color())
    for point in _measured_points(measured):
        ax.plot([point["gamma"]], [point["speedup"]], "kx", ms=10, mew=2)
        ax.annotate(f"measured α={point['alpha']:.2f}", (point["gamma"], point["speedup"]), fontsize=8)
    ax.axhline(1.0, color="grey", lw=0.8)
    title = f"Speed-up bound, c = {cost} (★ optimum, × measured)"
    return _finish(fig, ax, "γ (draft tokens per round)", "S = Ω / (γc + 1)", title, path)


def write_theory_plots(alphas, cost, gamma, rounds, out: Path, measured: Path | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [
        plot_omega_convergence(list(alphas), gamma, rounds, out / "omega_convergence.png"),
        plot_speedup(list(alphas), cost, out / "speedup_vs_gamma.png", measured),
    ]
