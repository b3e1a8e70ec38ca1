"""Judging a sampled token when the judge's logits differ from the sampler's by float noise.

The node samples exactly (``verifier.verify.sample_token``). A challenger or a referee later
recomputes the target's logits on another machine, or in a pass of another shape, and gets logits
that differ by float noise: up to ε per logit (measured: docs/design.md §4). The judge must never
call an honest token wrong because of that noise, and must still catch a wrong one. Three things
move under noise, and each gets a band sized so that ε ≤ TOLERANCE_DELTA / 2 can never flip it:

1. The noisy scores. The sampled token is argmax(z / T + G), where z are the logits, T the
   temperature and G the Gumbel noise (exact: derived bits, no floats from the model). Noise ε in
   z is ε / T in a score, so the band is TOLERANCE_DELTA in *logit* units, δ / T in score units.
   A band in score units would shrink to nothing in logit terms as T → 0, and an honest operator's
   near-ties at tiny temperatures would be judged wrong.
2. The top-k cut-off. A token whose scaled logit is within the band of the k-th largest may be kept
   on one machine and masked on another. *Possibly kept*: at least the cut-off minus the band.
   *Surely kept*: at least the cut-off plus the band.
3. The top-p cut-off. A token is kept when the probability mass ahead of it is below top_p. Noise
   moves each probability by a factor of at most e^(±band), so the mass by at most
   expm1(band); near-equal logits may also swap order. *Possibly kept*: the mass of tokens surely
   ahead (more than a band above), with the normaliser over every possibly kept token, is below
   top_p + slack. *Surely kept*: the mass of tokens possibly ahead (within a band or above), with the
   normaliser over the surely kept tokens, is below top_p − slack.

A claimed token is correct when it is possibly kept and its noisy score is within the band of the
best noisy score among the surely kept tokens. An honest token passes: it was kept and best on the
sampler's machine, and every surely kept token was kept there too. A cheater gains only tokens within
a band of the best, or within a band of a cut-off. The node, the challenger and the referee all judge
with this module. Temperatures below GREEDY_BELOW are greedy everywhere (``SamplingParams.greedy``).
"""

from __future__ import annotations

import numpy as np

from verifier.noise import STREAM_GUMBEL, gumbel
from verifier.params import SamplingParams

# In logit units. Pass-shape drift on CPU float32 measured ≤ 1.1e-4 (SmolLM2, torch's kernel), and
# 0 on the served kernel; an honest token is safe while the drift is at most half of this.
TOLERANCE_DELTA = 1e-3


def _top_k_bounds(scaled: np.ndarray, top_k: int, band: float) -> tuple[np.ndarray, np.ndarray]:
    """(possibly kept, surely kept) by top-k, each [V] bool; ties at the k-th are kept."""
    if not 0 < top_k < scaled.size:
        everything = np.ones(scaled.size, dtype=bool)
        return everything, everything.copy()
    kth = np.partition(scaled, -top_k)[-top_k]
    return scaled >= kth - band, scaled >= kth + band


def _top_p_bounds(scaled, top_p, band, possibly, surely) -> tuple[np.ndarray, np.ndarray]:
    """(possibly kept, surely kept) by top-p within the top-k bounds; each [V] bool."""
    if top_p >= 1.0:
        return possibly, surely
    slack = float(np.expm1(band))
    weights = np.exp(scaled - scaled[possibly].max())  # [V]
    order = np.argsort(-scaled, kind="stable")
    descending = -scaled[order]  # ascending, for searchsorted
    surely_w, possibly_w = np.where(surely, weights, 0.0), np.where(possibly, weights, 0.0)
    surely_cum = np.concatenate(([0.0], np.cumsum(surely_w[order])))
    possibly_cum = np.concatenate(([0.0], np.cumsum(possibly_w[order])))
    above = np.searchsorted(descending, -(scaled + band), side="left")  # how many score > x + band
    near_or_above = np.searchsorted(descending, -(scaled - band), side="right")  # how many ≥ x − band
    with np.errstate(divide="ignore", invalid="ignore"):
        surely_ahead = surely_cum[above] / possibly_cum[-1]
        possibly_ahead = (possibly_cum[near_or_above] - possibly_w) / surely_cum[-1]
    possibly_kept = possibly & (surely_ahead < top_p + slack)
    alone_on_top = possibly_cum[near_or_above] - possibly_w <= 0.0  # the top token is always kept
    surely_kept = surely & ((possibly_ahead < top_p - slack) | alone_on_top)
    return possibly_kept, surely_kept


def kept_bounds(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """(possibly kept, surely kept) under ``params``'s top-k and top-p for any logits within the
    noise bound of ``logits`` ([V]); each [V] bool. Greedy keeps everything."""
    x = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        everything = np.ones(x.size, dtype=bool)
        return everything, everything.copy()
    scaled, band = x / params.temperature, TOLERANCE_DELTA / params.temperature
    possibly, surely = _top_k_bounds(scaled, params.top_k, band)
    return _top_p_bounds(scaled, params.top_p, band, possibly, surely)


def shortfall(logits: np.ndarray, params: SamplingParams, seed: int, k: int, token: int) -> float:
    """How far, in logit units, ``token``'s noisy score at position k falls below the best noisy
    score among the surely kept tokens (≤ 0 when it is the best); infinite when it cannot have
    been kept. ``logits`` is the judge's [V] row."""
    x = np.asarray(logits, dtype=np.float64)
    if params.greedy:
        return float(x.max() - x[token])
    possibly, surely = kept_bounds(x, params)
    if not possibly[token]:
        return float("inf")
    scores = x / params.temperature + gumbel(seed, k, x.size, STREAM_GUMBEL)  # [V]
    surely[token] = True
    return float(params.temperature * (scores[surely].max() - scores[token]))


def within_tolerance(logits: np.ndarray, params: SamplingParams, seed: int, k: int, token: int) -> bool:
    """Is ``token`` an acceptable sample at position k, given the judge's logits ([V])?"""
    return shortfall(logits, params, seed, k, token) <= TOLERANCE_DELTA
