"""Whom the target asks for drafts, whose draft it verifies, and who sits out for a while.

Drafters post no bond and are never slashed: a bad drafter only loses the chance to draft. A
peer is *benched* (not asked) when, after ``min_tokens_to_judge`` tokens, its match rate is below
``min_match_rate``, or when it fails ``max_consecutive_failures`` rounds in a row. Each bench
lasts twice as long as the previous one (capped). The window a peer was benched on stays as judged
for the bench (``Registry.snapshot`` shows it beside the reason), and its end starts a fresh trial
window, so a drafter that improved can come back, while one that stays bad sits out ever longer.

Score (what ranking sorts by, best first)::

    score = match_rate * reliability / (1 + (latency_ms / latency_budget_ms) ** 4)

* ``match_rate``  -- Beta(1, 1) posterior mean of the per-token match probability. The expected
  accepted length of a gamma-token draft, (1 - a**(gamma+1)) / (1 - a), is increasing in a, so
  ranking by ``a`` ranks by expected tokens matched per round.
* ``reliability`` -- (rounds + 1) / (rounds + timeouts + errors + 1): the share of rounds answered
  in time, with one imaginary in-time round as an optimistic prior (1 for a new peer). Catches a
  peer that times out every other round and so never fails twice in a row.
* latency factor -- a soft deadline: ~1 well under the budget, 1/2 at the budget, ~0 beyond it.
  1 before the first latency sample (optimistic). Strictly decreasing in latency.

The score is increasing in match rate and decreasing in latency. Peers not yet judged (fewer than
``min_tokens_to_judge`` tokens in their window) are ranked with ``explore_match_rate`` in place of
their match rate (when higher) so that new drafters get tried; the cost of trying one is bounded
by ``min_tokens_to_judge`` tokens.

Probation: while no token of a peer's drafts has matched in its trial window, its drafts are
measured against the tokens the target emits but never verified, and no round waits for them (they
may arrive while the round's pass runs). Under sample-and-match a draft whose first token misses is
worth nothing, and hostile drafters (random, lying, adversarial) miss every first token, so trying
one costs the target no verification width and no waiting. An honest drafter leaves probation with
its first matched token (a first-token hit, ~0.85 of rounds on the qwen2.5-coder pair at T = 0.8):
the price is one unverified round per trial window.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from market.registry import DrafterStats, MarketError, Registry

log = logging.getLogger(__name__)

LATENCY_EXPONENT = 4  # sharpness of the soft latency deadline in ``score``
DEFAULT_DEADLINE_MS = 100.0  # the per-round draft deadline of a target that does not set one


@dataclass(frozen=True)
class PolicyConfig:
    min_tokens_to_judge: int = 64  # no verdict on a drafter's match rate before this many proposed tokens
    min_match_rate: float = 0.05  # judged drafters below this match rate are benched
    max_consecutive_failures: int = 2  # this many timeouts/errors in a row bench the drafter
    max_untried_refusals: int = 2  # this many refusals ("busy") in a row bench a drafter not yet judged
    bench_base_s: float = 30.0  # length of the first bench; each further bench doubles it...
    bench_max_s: float = 600.0  # ...up to this cap
    latency_budget_ms: float = DEFAULT_DEADLINE_MS  # per-round draft deadline the target uses
    explore_match_rate: float = 1.0  # optimistic match rate used to rank unjudged drafters (1.0: try them first)
    probation: bool = True  # drafts of a peer with no matched token in its window are measured, not verified

    def __post_init__(self) -> None:
        checks = {
            "min_tokens_to_judge: int >= 1": _is_int(self.min_tokens_to_judge) and self.min_tokens_to_judge >= 1,
            "max_consecutive_failures: int >= 1": _is_int(self.max_consecutive_failures)
            and self.max_consecutive_failures >= 1,
            "max_untried_refusals: int >= 1": _is_int(self.max_untried_refusals) and self.max_untried_refusals >= 1,
            "0 <= min_match_rate < 1": _is_real(self.min_match_rate) and 0 <= self.min_match_rate < 1,
            "0 < explore_match_rate <= 1": _is_real(self.explore_match_rate) and 0 < self.explore_match_rate <= 1,
            "0 < bench_base_s <= bench_max_s": _is_real(self.bench_base_s)
            and _is_real(self.bench_max_s)
            and 0 < self.bench_base_s <= self.bench_max_s,
            "latency_budget_ms > 0": _is_real(self.latency_budget_ms) and self.latency_budget_ms > 0,
            "probation: bool": isinstance(self.probation, bool),
        }
        bad = [what for what, ok in checks.items() if not ok]
        if bad:
            raise MarketError(f"invalid PolicyConfig {self}: need {'; '.join(bad)}")

    def bench_duration(self, bench_count: int) -> float:
        """Length of the ``bench_count``-th bench (1-based): base * 2**(count - 1), capped."""
        return min(self.bench_base_s * 2.0 ** min(bench_count - 1, 60), self.bench_max_s)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """A finite int or float (bools, NaN and infinities refused)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class Policy:
    """Benches and ranks drafters from the stats in a ``Registry``; state lives in the stats."""

    def __init__(self, config: PolicyConfig | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config if config is not None else PolicyConfig()
        self._clock = clock

    def update(self, registry: Registry, peer_id: str) -> None:
        """Judge ``peer_id`` after a ``record_*`` call; bench it if it is failing."""
        s = registry.stats(peer_id)
        now = self._clock()
        if s.benched_until > now:
            return  # already sitting out; stray late results count for its lifetime only
        reason = self._bench_reason(s)
        if reason is not None:
            self._bench(peer_id, s, now, reason)

    def _bench_reason(self, s: DrafterStats) -> str | None:
        cfg = self.config
        if s.consecutive_failures >= cfg.max_consecutive_failures:
            return f"{s.consecutive_failures} consecutive timeouts/errors"
        # INVARIANT: a refusal never leaves a peer unjudged for good (it would hold the untried slot)
        if not self.is_judged(s) and s.consecutive_refusals >= cfg.max_untried_refusals:
            return f"{s.consecutive_refusals} refusals in a row before it was judged"
        if s.judged_tokens >= cfg.min_tokens_to_judge and s.match_rate < cfg.min_match_rate:
            return f"match rate {s.match_rate:.3f} < {cfg.min_match_rate} over {s.judged_tokens} offered tokens"
        return None

    def _bench(self, peer_id: str, s: DrafterStats, now: float, reason: str) -> None:
        s.bench_count += 1
        duration = self.config.bench_duration(s.bench_count)
        s.benched_until = now + duration
        s.bench_reason = reason
        s.window_closed = True  # kept as judged for the bench; the registry empties it when the bench ends
        log.info("benching drafter %s for %.0fs (bench #%d): %s", peer_id, duration, s.bench_count, reason)

    def is_benched(self, stats: DrafterStats) -> bool:
        return stats.benched_until > self._clock()

    def eligible(self, registry: Registry) -> list[str]:
        """Known peers that are not benched now, sorted by peer id."""
        now = self._clock()
        return [p for p in registry.peers() if registry.stats(p).benched_until <= now]

    def on_probation(self, stats: DrafterStats) -> bool:
        """No token of the peer's drafts has matched in its trial window: its drafts are measured,
        never verified or waited for (see the module docstring)."""
        return self.config.probation and stats.matched == 0

    def is_judged(self, stats: DrafterStats) -> bool:
        return stats.judged_tokens >= self.config.min_tokens_to_judge

    def select(self, registry: Registry, n: int, exclude: Iterable[str] = ()) -> list[str]:
        """Up to ``n`` eligible peers, not in ``exclude`` (busy, gone), to ask for drafts: the judged
        ones best first, and at most one untried peer, so untried identities, which are free to mint,
        can never crowd out the best judged drafter; with n = 1 the best judged drafter goes first.
        The untried slot goes to the least tried (fewest jobs in its trial window), then the best
        record (lifetime match rate: a veteran back from a bench before unknown peers, a bad one
        after them), then the longest waiting (first seen): never by peer id, which a peer can
        grind, so no identity can take the slot every time (a peer that leaves and registers again
        keeps its stats and first sighting: ``Registry.forget``), and never by lifetime jobs, which
        would rank a veteran back from a bench behind every newcomer."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise MarketError(f"n must be a non-negative int, got {n!r}")
        out = frozenset(exclude)
        eligible = [p for p in self.eligible(registry) if p not in out]
        judged = self.rank(registry, [p for p in eligible if self.is_judged(registry.stats(p))], explore=False)
        untried = [p for p in eligible if not self.is_judged(registry.stats(p))]
        untried.sort(
            key=lambda p: (
                registry.stats(p).window_jobs,
                -registry.stats(p).lifetime_match_rate,
                -self._explore_score(registry.stats(p)),
                registry.info(p).first_seen,
                p,  # the same first sighting (one clock tick): any fixed order
            )
        )
        slot = untried[:1] if n >= 2 or not judged else []
        return (judged[: n - len(slot)] + slot)[:n]

    def rank(self, registry: Registry, peer_ids: Iterable[str], *, explore: bool = True) -> list[str]:
        """``peer_ids`` (deduplicated) best first, by score, ties by peer id; benched peers are kept.

        With ``explore`` (the default, as in ``select``) unjudged peers are ranked optimistically;
        without it, by their plain ``score`` (the expected value of verifying their draft).
        """
        key = self._explore_score if explore else self.score
        scored = [(-key(registry.stats(p)), p) for p in dict.fromkeys(peer_ids)]
        return [p for _, p in sorted(scored)]

    def score(self, stats: DrafterStats) -> float:
        """match_rate * reliability * latency factor (see the module docstring)."""
        return self._score(stats, stats.match_rate)

    def _explore_score(self, stats: DrafterStats) -> float:
        rate = stats.match_rate
        if not self.is_judged(stats):
            rate = max(rate, self.config.explore_match_rate)
        return self._score(stats, rate)

    def _score(self, stats: DrafterStats, rate: float) -> float:
        reliability = (stats.rounds + 1) / (stats.rounds + stats.timeouts + stats.errors + 1)
        latency = 1.0
        if stats.latency_ms is not None:
            latency = 1.0 / (1.0 + (stats.latency_ms / self.config.latency_budget_ms) ** LATENCY_EXPONENT)
        return rate * reliability * latency
