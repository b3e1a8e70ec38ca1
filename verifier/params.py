"""Sampling parameters and the one logits-processing function every component shares."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verifier.errors import InvalidParams

MAX_TEMPERATURE = 100.0
# Below this temperature sampling is greedy, for every party: a sample at T = 1e-6 is the argmax but
# for ties, and judging it needs the same band as greedy decoding (verifier.tolerance).
GREEDY_BELOW = 1e-2
# top_p is a multiple of this: a client cannot aim the cut-off at a cumulative-probability boundary
# of its choosing to the micro (the judge's top-p band covers what float noise can move).
TOP_P_STEP = 0.01
TOP_P_STEPS = round(1 / TOP_P_STEP)
TOP_P_CANDIDATES = 1024  # the top-p prefix is sought among this many largest logits before a full sort


@dataclass(frozen=True)
class SamplingParams:
    """temperature below GREEDY_BELOW (0 included) means greedy; top_k 0 means off; top_p 1.0 means
    off, else a multiple of TOP_P_STEP."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not np.isfinite(t):
            raise InvalidParams(f"temperature must be a finite number, got {t!r}")
        if not 0.0 <= t <= MAX_TEMPERATURE:
            raise InvalidParams(f"temperature must be in [0, {MAX_TEMPERATURE}], got {t}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidParams(f"top_k must be an integer >= 0 (0 = off), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise InvalidParams(f"top_p must be in (0, 1] (1 = off), got {p!r}")
        if abs(p * TOP_P_STEPS - round(p * TOP_P_STEPS)) > 1e-6:
            raise InvalidParams(f"top_p must be a multiple of {TOP_P_STEP}, got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def to_dict(self) -> dict[str, float | int]:
        return {"temperature": float(self.temperature), "top_k": self.top_k, "top_p": float(self.top_p)}


def process_logits(logits: np.ndarray, params: SamplingParams) -> np.ndarray:  # [V] -> [V] float64
    """Temperature, then top-k, then top-p, in float64; removed tokens become -inf.

    Order and tie rules (used identically by target, drafter, challenger and referee):
    - greedy (T < GREEDY_BELOW) returns the raw logits: only their argmax matters;
    - top-k keeps every token whose scaled logit is >= the k-th largest (ties at the k-th are kept);
    - top-p keeps the shortest prefix of tokens, sorted by descending logit (stable, lower id
      first on ties), whose cumulative probability reaches top_p; the top token is always kept.
    """
    x = np.asarray(logits, dtype=np.float64).copy()
    if x.ndim != 1:
        raise InvalidParams(f"process_logits expects a [V] vector, got shape {x.shape}")
    if params.greedy:
        return x
    x /= params.temperature
    if 0 < params.top_k < x.size:
        kth = np.partition(x, -params.top_k)[-params.top_k]
        x[x < kth] = -np.inf
    if params.top_p < 1.0:
        x = _top_p(x, params.top_p)
    return x


def _top_p(x: np.ndarray, top_p: float) -> np.ndarray:  # [V] -> [V]
    """The top-p cut of ``x``. The prefix is first sought among the TOP_P_CANDIDATES largest logits,
    sorted exactly as the full sort sorts them (every other logit is smaller, so it sorts after
    them): where their cumulative probability reaches top_p the cut is the full sort's, bit for bit,
    at a fraction of its cost (a full argsort of 152k logits is ~15 ms, per token and per verified
    row); otherwise the whole vector is sorted."""
    probs = softmax(x)
    if x.size > TOP_P_CANDIDATES:
        kth = np.partition(x, -TOP_P_CANDIDATES)[-TOP_P_CANDIDATES]
        candidates = np.flatnonzero(x >= kth)  # ascending ids; every tie at the k-th value included
        order = candidates[np.argsort(-x[candidates], kind="stable")]
        cumulative = np.cumsum(probs[order])
        if cumulative[-1] >= top_p:
            return _keep(x, order, cumulative, top_p)
    order = np.argsort(-x, kind="stable")
    return _keep(x, order, np.cumsum(probs[order]), top_p)


def _keep(x: np.ndarray, order: np.ndarray, cumulative: np.ndarray, top_p: float) -> np.ndarray:
    """``x`` with only the shortest prefix of ``order`` whose cumulative probability reaches top_p."""
    n_keep = int(np.searchsorted(cumulative, top_p, side="left")) + 1
    kept = np.full_like(x, -np.inf)
    kept[order[:n_keep]] = x[order[:n_keep]]
    return kept


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - np.max(x))
    return z / z.sum()


def token_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:  # [V] -> [V] float64
    """The distribution a sample is drawn from; one-hot on the argmax when greedy."""
    return processed_probs(process_logits(logits, params), params)


def processed_probs(processed: np.ndarray, params: SamplingParams) -> np.ndarray:  # [V] -> [V] float64
    """``token_probs`` from logits already processed (``process_logits``)."""
    if params.greedy:
        probs = np.zeros(np.asarray(processed).shape[-1])
        probs[int(np.argmax(processed))] = 1.0
        return probs
    return softmax(processed)
