"""Expected speed-up of speculative decoding, after Leviathan, Kalman & Matias (2023), §3.

With i.i.d. per-token acceptance probability α and γ drafts per round:
- expected tokens per target pass (Eq. 1):  Ω(α, γ) = (1 − α^(γ+1)) / (1 − α)
- walltime improvement (Thm 3.8):           S = Ω / (γ·c + 1), c = t_draft / t_target
We also allow a measured verify cost v = t_target(γ+1 positions) / t_target(1 position), which the
paper takes as 1:                          S = Ω / (γ·c + v).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verifier.errors import InvalidParams

MAX_THEORY_GAMMA = 32


def _check(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise InvalidParams(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise InvalidParams(f"gamma must be >= 0, got {gamma}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Ω(α, γ): expected tokens emitted per target pass."""
    _check(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def speedup(alpha: float, gamma: int, cost: float, verify_cost: float = 1.0) -> float:
    """S(α, γ, c, v) = Ω / (γ·c + v)."""
    if cost < 0 or verify_cost <= 0:
        raise InvalidParams(f"costs must be non-negative (verify > 0), got c={cost}, v={verify_cost}")
    return expected_tokens(alpha, gamma) / (gamma * cost + verify_cost)


def optimal_gamma(alpha: float, cost: float, max_gamma: int = MAX_THEORY_GAMMA, verify_cost: float = 1.0) -> int:
    """The γ in [1, max_gamma] that maximises S (ties: the smallest)."""
    values = [speedup(alpha, g, cost, verify_cost) for g in range(1, max_gamma + 1)]
    return 1 + int(np.argmax(values))


@dataclass(frozen=True)
class Simulation:
    tokens_per_round: np.ndarray  # [rounds] tokens emitted in each simulated round
    running_mean: np.ndarray  # [rounds] mean tokens per round after each round


def simulate_rounds(alpha: float, gamma: int, rounds: int, seed: int = 0) -> Simulation:
    """Monte-Carlo rounds: each draft is accepted with probability α until the first rejection;
    a round emits the accepted drafts plus one recovered/bonus token."""
    _check(alpha, gamma)
    if rounds < 1:
        raise InvalidParams(f"rounds must be >= 1, got {rounds}")
    rng = np.random.default_rng(seed)
    accepts = rng.random((rounds, gamma)) < alpha  # [rounds, γ]
    first_reject = np.where(accepts.all(axis=1), gamma, np.argmin(accepts, axis=1))
    tokens = first_reject + 1
    return Simulation(tokens, np.cumsum(tokens) / np.arange(1, rounds + 1))


def alpha_from_omega(omega: float, gamma: int) -> float:
    """Invert Ω(α, γ) by bisection: the i.i.d. acceptance rate that explains a measured
    mean of tokens per target pass (Ω is increasing in α)."""
    if gamma < 1 or not 1.0 <= omega <= gamma + 1:
        raise InvalidParams(f"need gamma >= 1 and 1 <= omega <= gamma+1, got omega={omega}, gamma={gamma}")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, gamma) < omega else (lo, mid)
    return (lo + hi) / 2
