"""The drafters a target knows about, and how each has done so far.

Discovery (libp2p) calls ``upsert``; the decode loop calls the ``record_*`` methods after every
round and job. The registry only keeps score: whom to ask is ``market.policy``'s business, what
is owed is ``market.ledger``'s. Times come from an injectable monotonic clock, so they are only
meaningful relative to each other, never as wall-clock dates.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

MAX_PEER_ID_LEN = 128
LATENCY_EWMA_ALPHA = 0.2  # weight of the newest latency sample
BUSY_BACKOFF_S = 5.0  # a drafter that refused a session (full) is not asked again this soon
REMEMBER_DEPARTED_S = 3600.0  # a departed peer's judgement is kept this long (past the longest bench)
MAX_DEPARTED = 4096  # departed peers remembered at most; the oldest departure is forgotten first


class MarketError(SpecmarketError, ValueError):
    """Bad input to the market (unknown peer, negative counts, nonsense config, closed ledger...)."""


def check_peer_id(peer_id: object) -> str:
    """A peer id must be a non-empty string of at most ``MAX_PEER_ID_LEN`` characters."""
    if not isinstance(peer_id, str) or not peer_id or len(peer_id) > MAX_PEER_ID_LEN:
        raise MarketError(f"peer id must be a non-empty str of at most {MAX_PEER_ID_LEN} chars, got {peer_id!r:.80}")
    return peer_id


def check_count(name: str, value: object) -> int:
    """A token or event count must be a non-negative int (bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MarketError(f"{name} must be a non-negative int, got {value!r}")
    return value


@dataclass
class DrafterStats:
    """Running score of one drafter (mutable; owned by the ``Registry``).

    ``offered``, ``proposed``, ``matched``, ``waited_s`` and ``consecutive_failures`` are the current
    *trial window*. ``market.policy`` closes it when it benches the peer: during the bench the window
    stays as it was judged (what /health shows beside ``bench_reason``, and nothing a stray late
    result changes), and the ``Registry`` empties it when the bench ends, so the peer is judged
    afresh. ``lifetime_*`` never reset.
    """

    rounds: int = 0  # rounds in which the peer's draft arrived in time
    offered: int = 0  # the round's γ for each of those rounds: what it could have proposed (window)
    proposed: int = 0  # draft tokens received (current trial window)
    matched: int = 0  # of those, tokens that matched the target's output, verified or not
    accepted: int = 0  # tokens credited: accepted in the draft actually verified
    timeouts: int = 0  # rounds that reached the deadline without the peer's draft (a failure)
    late: int = 0  # rounds closed early, on a better-ranked peer's draft, before this one's arrived (no failure)
    errors: int = 0  # protocol violations, dropped streams
    refusals: int = 0  # sessions it refused because it was full: no failure, only a short busy back-off
    jobs: int = 0
    window_jobs: int = 0  # jobs in the current trial window: how tried an untried peer is (market.policy)
    consecutive_refusals: int = 0  # refusals since its last in-time draft (window): an untried one is benched
    latency_ms: float | None = None  # EWMA (alpha 0.2) of the draft round trip; None until a sample
    consecutive_failures: int = 0  # timeouts + errors since the last in-time draft
    benched_until: float = 0.0  # clock time before which the peer is not asked
    busy_until: float = 0.0  # clock time before which a peer that refused (full) is not asked
    bench_count: int = 0  # how many times it has been benched (drives the backoff)
    bench_reason: str = ""
    last_error: str = ""
    lifetime_proposed: int = 0
    lifetime_matched: int = 0

    waited_s: float = 0.0  # seconds the target waited for this peer's in-time drafts (window)
    window_closed: bool = False  # benched on this window: kept as judged until the bench ends, then emptied

    @property
    def match_rate(self) -> float:
        """Posterior mean of the per-token match probability under a Beta(1, 1) (uniform) prior,
        per token *offered*: a round's γ, whatever the draft's length. An empty or short draft
        counts as the tokens it did not propose, so answering every round with nothing is judged
        like proposing nothing useful (it used to leave the peer unjudged, and so always tried).

        0.5 for a peer with no data, tending to matched/offered as evidence accumulates.
        """
        return (self.matched + 1) / (max(self.offered, self.proposed) + 2)

    @property
    def judged_tokens(self) -> int:
        """The evidence behind ``match_rate`` (current window)."""
        return max(self.offered, self.proposed)

    @property
    def tokens_per_wait_s(self) -> float | None:
        """Matched tokens per second of waiting for this peer's drafts (window); None before any."""
        return self.matched / self.waited_s if self.waited_s > 0 else None

    @property
    def lifetime_match_rate(self) -> float:
        """Same Beta(1, 1) posterior mean, over every token ever received from the peer."""
        return (self.lifetime_matched + 1) / (self.lifetime_proposed + 2)

    def reset_window(self) -> None:
        """Start a fresh trial: forget the windowed match evidence and the failure streak."""
        self.proposed = 0
        self.offered = 0
        self.matched = 0
        self.waited_s = 0.0
        self.consecutive_failures = 0
        self.consecutive_refusals = 0
        self.window_jobs = 0
        self.window_closed = False


@dataclass(frozen=True)
class DrafterInfo:
    peer_id: str
    addrs: tuple[str, ...]
    first_seen: float
    last_seen: float


class Registry:
    """Known drafters and their stats.

    Not thread-safe, and needs not be: it is used from a single trio event loop, and no method
    awaits, so every call runs to completion without interleaving.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._info: dict[str, DrafterInfo] = {}
        self._stats: dict[str, DrafterStats] = {}
        # peers that left: peer -> (stats, first seen, left at), in order of departure
        self._departed: OrderedDict[str, tuple[DrafterStats, float, float]] = OrderedDict()

    # -- discovery -------------------------------------------------------------------------

    def upsert(self, peer_id: str, addrs: Sequence[str]) -> bool:
        """Record that ``peer_id`` was seen at ``addrs``; True if it is newly discovered."""
        check_peer_id(peer_id)
        if isinstance(addrs, str) or not all(isinstance(a, str) for a in addrs):
            raise MarketError(f"addrs must be a sequence of str, got {addrs!r:.120}")
        now = self._clock()
        old = self._info.get(peer_id)
        first_seen = now if old is None else old.first_seen
        if old is None:
            returning = self._returning(peer_id)
            stats, first_seen = returning or (DrafterStats(), now)
            self._stats[peer_id] = stats
            again = " (back: judged as before it left)" if returning else ""
            log.info("discovered drafter %s at %s%s", peer_id, ", ".join(addrs) or "(no address)", again)
        self._info[peer_id] = DrafterInfo(peer_id, tuple(addrs), first_seen, now)
        return old is None

    def forget(self, peer_id: str) -> None:
        """The peer left (a no-op for an unknown one): it is no longer asked, but its judgement
        (stats, bench, jobs, first sighting) is remembered for REMEMBER_DEPARTED_S, so leaving and
        registering again resets no bench, no trial and no place among the untried peers."""
        info, stats = self._info.pop(peer_id, None), self._stats.pop(peer_id, None)
        if info is None or stats is None:
            return
        now = self._clock()
        self._departed.pop(peer_id, None)
        self._departed[peer_id] = (stats, info.first_seen, now)
        while self._departed:  # oldest departure first: drop the stale ones and those past the cap
            _, (_, _, left_at) = next(iter(self._departed.items()))
            if len(self._departed) <= MAX_DEPARTED and now - left_at <= REMEMBER_DEPARTED_S:
                break
            self._departed.popitem(last=False)

    def _returning(self, peer_id: str) -> tuple[DrafterStats, float] | None:
        """The remembered stats and first sighting of a peer that left less than REMEMBER_DEPARTED_S ago."""
        entry = self._departed.pop(peer_id, None)
        if entry is None or self._clock() - entry[2] > REMEMBER_DEPARTED_S:
            return None
        return entry[0], entry[1]

    def prune(self, max_age_s: float) -> list[str]:
        """Forget the peers not seen for more than ``max_age_s``; return them, sorted.

        A forgotten peer that comes back within REMEMBER_DEPARTED_S is judged as before (``forget``);
        the memory is bounded (MAX_DEPARTED), since peer ids are free to mint.
        """
        if not math.isfinite(max_age_s) or max_age_s < 0:
            raise MarketError(f"max_age_s must be finite and >= 0, got {max_age_s!r}")
        cutoff = self._clock() - max_age_s
        gone = sorted(p for p, info in self._info.items() if info.last_seen < cutoff)
        for peer_id in gone:
            self.forget(peer_id)
        if gone:
            log.info("pruned %d drafter(s) unseen for %.0fs: %s", len(gone), max_age_s, ", ".join(gone))
        return gone

    def peers(self) -> list[str]:
        """Every known peer id, sorted."""
        return sorted(self._info)

    def info(self, peer_id: str) -> DrafterInfo:
        return self._info[self._known(peer_id)]

    def stats(self, peer_id: str) -> DrafterStats:
        """The peer's stats; a window closed by a bench that is over is emptied first (a new trial)."""
        s = self._stats[self._known(peer_id)]
        if s.window_closed and s.benched_until <= self._clock():
            s.reset_window()
        return s

    def __contains__(self, peer_id: object) -> bool:
        return peer_id in self._info

    def __len__(self) -> int:
        return len(self._info)

    def _known(self, peer_id: str) -> str:
        if peer_id not in self._info:
            raise MarketError(f"unknown drafter {peer_id!r:.80}")
        return peer_id

    # -- outcomes --------------------------------------------------------------------------

    def record_draft(
        self, peer_id: str, proposed: int, matched: int, latency_s: float | None, offered: int | None = None
    ) -> None:
        """A draft of ``proposed`` tokens arrived in time, ``matched`` of them matched the target;
        ``offered`` is the round's γ (default ``proposed``): what the peer could have proposed.
        ``latency_s`` None: the draft was there before the round asked (an early draft), so it gives
        no latency sample and the EWMA stays as it was."""
        s = self.stats(peer_id)
        check_count("proposed", proposed)
        offered = max(proposed, check_count("offered", offered) if offered is not None else proposed)
        check_count("matched", matched)
        if matched > proposed:
            raise MarketError(f"matched ({matched}) exceeds proposed ({proposed})")
        if latency_s is not None and (
            isinstance(latency_s, bool) or not isinstance(latency_s, int | float) or not 0 <= latency_s < math.inf
        ):
            raise MarketError(f"latency_s must be a finite number >= 0 or None, got {latency_s!r}")
        if latency_s is not None:
            sample_ms = latency_s * 1000.0
            old_ms = sample_ms if s.latency_ms is None else s.latency_ms
            s.latency_ms = (1 - LATENCY_EWMA_ALPHA) * old_ms + LATENCY_EWMA_ALPHA * sample_ms
        s.rounds += 1
        s.lifetime_proposed += proposed
        s.lifetime_matched += matched
        if not s.window_closed:  # benched: a stray late draft counts for its lifetime only
            s.waited_s += latency_s or 0.0
            s.offered += offered
            s.proposed += proposed
            s.matched += matched
            s.consecutive_failures = 0
            s.consecutive_refusals = 0
        self._touch(peer_id)

    def record_accepted(self, peer_id: str, accepted: int) -> None:
        """Credit ``accepted`` tokens of the peer's draft that the target verified."""
        self.stats(peer_id).accepted += check_count("accepted", accepted)

    def record_timeout(self, peer_id: str) -> None:
        s = self.stats(peer_id)
        s.timeouts += 1
        if not s.window_closed:  # benched: the streak it was judged on stays as it was
            s.consecutive_failures += 1

    def record_late(self, peer_id: str) -> None:
        """The round closed on a better-ranked draft before the deadline; not held against the peer."""
        self.stats(peer_id).late += 1

    def record_error(self, peer_id: str, reason: str) -> None:
        """A protocol violation or dropped stream; ``reason`` is kept for /health."""
        s = self.stats(peer_id)
        s.errors += 1
        if not s.window_closed:
            s.consecutive_failures += 1
        s.last_error = str(reason)[:200]
        log.debug("drafter %s error: %s", peer_id, s.last_error)

    def record_refusal(self, peer_id: str, reason: str, busy_s: float = BUSY_BACKOFF_S) -> None:
        """The peer refused a session because it is full: neither an error nor a failure (nothing
        that lowers its score); it is left alone for ``busy_s``, and an untried peer that keeps
        refusing is benched (``market.policy``: else it would hold the untried slot unjudged)."""
        if not math.isfinite(busy_s) or busy_s < 0:
            raise MarketError(f"busy_s must be finite and >= 0, got {busy_s!r}")
        s = self.stats(peer_id)
        s.refusals += 1
        if not s.window_closed:
            s.consecutive_refusals += 1
        s.busy_until = self._clock() + busy_s
        log.debug("drafter %s refused a session: %s", peer_id, str(reason)[:200])

    def is_busy(self, peer_id: str) -> bool:
        """Did the peer refuse a session (full) less than its back-off ago?"""
        return self.stats(peer_id).busy_until > self._clock()

    def record_job(self, peer_id: str) -> None:
        """The peer took part in one more job."""
        s = self.stats(peer_id)
        s.jobs += 1
        s.window_jobs += 1

    def _touch(self, peer_id: str) -> None:
        """An answering peer is alive: keep ``prune`` from forgetting it."""
        old = self._info[peer_id]
        self._info[peer_id] = DrafterInfo(peer_id, old.addrs, old.first_seen, self._clock())

    # -- export ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, dict]:
        """JSON-ready per-peer stats, keyed by peer id (for /health and /metrics). A benched peer's
        window, ``match_rate`` included, is the one its ``bench_reason`` judged."""
        now = self._clock()
        out: dict[str, dict] = {}
        for peer_id in self.peers():
            info, s = self._info[peer_id], self.stats(peer_id)
            row = asdict(s)
            for internal in ("benched_until", "busy_until", "window_closed"):
                row.pop(internal)
            row.update(
                addrs=list(info.addrs),
                seen_ago_s=round(now - info.last_seen, 3),
                known_for_s=round(now - info.first_seen, 3),
                match_rate=round(s.match_rate, 4),
                lifetime_match_rate=round(s.lifetime_match_rate, 4),
                latency_ms=None if s.latency_ms is None else round(s.latency_ms, 3),
                benched=s.benched_until > now,
                bench_remaining_s=round(max(0.0, s.benched_until - now), 3),
                busy=s.busy_until > now,
            )
            out[peer_id] = row
        return out
