"""``GET /metrics``: the engine's counters, per-drafter series, the operator's standing on the chain,
HTTP responses by status code and latency histograms, with ``prometheus_client`` on a registry of
the app's own (several nodes can share one process). Names follow Prometheus' conventions: base
units (seconds, wei), ``_total`` only on counters, ``_ratio`` for fractions."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from node.target.engine import Engine

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes
ENGINE_METRICS = (  # (EngineCounters field, metric name, counter?, help)
    ("requests", "requests_total", True, "Completion jobs started."),
    ("requests_failed", "requests_failed_total", True, "Completion jobs that ended in an error."),
    ("requests_cancelled", "requests_cancelled_total", True, "Jobs cancelled: the client went away or stalled."),
    ("requests_refused", "requests_refused_total", True, "Jobs refused because max_jobs were running (503)."),
    ("tokens_generated", "tokens_generated_total", True, "Verified tokens generated."),
    ("target_passes", "target_passes_total", True, "Target model forward passes."),
    ("target_positions", "target_positions_total", True, "Positions scored by the target (prefill included)."),
    ("draft_tokens_proposed", "draft_tokens_proposed_total", True, "Draft tokens proposed by drafters."),
    ("draft_tokens_accepted", "draft_tokens_accepted_total", True, "Draft tokens accepted by verification."),
    ("active_jobs", "active_jobs", False, "Completion jobs running now."),
)
# (registry snapshot field, metric name, counter?, scale, help): counters only for fields that never
# reset while the peer is known (the trial window's proposed/matched reset at a bench: gauges)
DRAFTER_METRICS = (
    ("lifetime_proposed", "drafter_proposed_tokens_total", True, 1, "Draft tokens received from the peer."),
    ("lifetime_matched", "drafter_matched_tokens_total", True, 1, "Of those, tokens that matched the output."),
    ("accepted", "drafter_accepted_tokens_total", True, 1, "Draft tokens accepted in verified drafts."),
    ("credited_tokens", "drafter_credited_tokens_total", True, 1, "Tokens credited in the ledger (lifetime)."),
    ("rounds", "drafter_rounds_total", True, 1, "Rounds whose draft arrived in time."),
    ("timeouts", "drafter_timeouts_total", True, 1, "Rounds that reached the deadline without a draft."),
    ("late", "drafter_late_rounds_total", True, 1, "Rounds closed on a better peer's draft before this one's."),
    ("errors", "drafter_errors_total", True, 1, "Protocol violations and dropped streams."),
    ("refusals", "drafter_refusals_total", True, 1, "Sessions refused because the peer was full."),
    ("jobs", "drafter_jobs_total", True, 1, "Jobs the peer was asked to draft for."),
    ("bench_count", "drafter_benched_total", True, 1, "Times the peer was benched."),
    ("proposed", "drafter_window_proposed_tokens", False, 1, "Draft tokens received in the trial window."),
    ("matched", "drafter_window_matched_tokens", False, 1, "Of those, tokens that matched the output."),
    ("match_rate", "drafter_match_ratio", False, 1, "Posterior mean match rate in the trial window."),
    ("consecutive_failures", "drafter_consecutive_failures", False, 1, "Timeouts and errors since the last draft."),
    ("latency_ms", "drafter_latency_seconds", False, 1e-3, "EWMA of the draft round trip."),
    ("benched", "drafter_benched", False, 1, "1 while the peer is benched."),
    ("bench_remaining_s", "drafter_bench_remaining_seconds", False, 1, "Time left on the peer's bench."),
    ("busy", "drafter_busy", False, 1, "1 while the peer is skipped for having refused (full)."),
)
# (operator field of /health, metric name, counter?, help)
OPERATOR_METRICS = (
    ("serving", "operator_serving", False, "1 while the operator may sign receipts (else answers are refused)."),
    ("chain_reachable", "chain_reachable", False, "1 while the chain answers the operator's watch."),
    ("active", "operator_active", False, "1 while registered and not unbonding."),
    ("unbonding", "operator_unbonding", False, "1 once the operator asked to unbond."),
    ("bond_wei", "operator_bond_wei", False, "The operator's bond on the chain, in wei."),
    ("receipts_signed", "receipts_signed_total", True, "Receipts signed since this start."),
)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

StatusFn = Callable[[], dict[str, Any]]
MAX_LISTED_DRAFTERS = 32  # the best drafters /health, the dashboard and /metrics (19 series each) list by name
OTHERS_LABEL = "(others)"  # the counters of the drafters past that, summed (never a peer id: not base58)


def _is_number(value: Any) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


class EngineCollector:
    """Reads the engine's counters and the node's drafter and operator view at every scrape."""

    def __init__(self, engine: Engine, status: StatusFn) -> None:
        self.engine, self.status = engine, status

    def collect(self) -> Iterator[Metric]:
        counters = self.engine.counters.snapshot()
        for key, name, counter, help_text in ENGINE_METRICS:
            yield _family(counter)(f"specmarket_{name}", help_text, value=counters.get(key, 0))
        view = self.status()
        drafters = view.get("drafters")
        drafters = dict(list(drafters.items())[:MAX_LISTED_DRAFTERS]) if isinstance(drafters, dict) else {}
        known = view.get("drafters_total", len(drafters))
        yield GaugeMetricFamily("specmarket_drafters_known", "Drafter peers the target knows of.", value=known)
        others = view.get("drafters_others")
        if isinstance(others, dict) and others.get("drafters"):  # the peers not listed, as one summed series
            drafters[OTHERS_LABEL] = {key: others.get(key) for key, _, counter, _, _ in DRAFTER_METRICS if counter}
        yield from _drafter_families(drafters)
        operator = view.get("operator")
        if isinstance(operator, dict):
            for key, name, counter, help_text in OPERATOR_METRICS:
                if _is_number(value := operator.get(key)) or type(value) is bool:
                    yield _family(counter)(f"specmarket_{name}", help_text, value=int(value))


def _family(counter: bool) -> type[CounterMetricFamily] | type[GaugeMetricFamily]:
    return CounterMetricFamily if counter else GaugeMetricFamily


def _drafter_families(drafters: dict[str, Any]) -> Iterator[Metric]:
    """One family per field of ``DRAFTER_METRICS``, a sample per peer that has a number for it."""
    rows = [(str(peer), stats) for peer, stats in sorted(drafters.items(), key=lambda kv: str(kv[0]))]
    for key, name, counter, scale, help_text in DRAFTER_METRICS:
        family = _family(counter)(f"specmarket_{name}", help_text, labels=["peer"])
        for peer, stats in rows:
            value = stats.get(key) if isinstance(stats, dict) else None
            if type(value) is bool or _is_number(value):
                family.add_metric([peer], value * scale)
        if family.samples:
            yield family


class ApiMetrics:
    """The app's registry; also the engine's ``JobObserver`` for the three latency histograms."""

    def __init__(self, engine: Engine, status: StatusFn) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(engine, status))
        self.ttft = Histogram(
            "specmarket_time_to_first_token_seconds",
            "From the start of a job to its first verified chunk.",
            buckets=FIRST_TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.itl = Histogram(
            "specmarket_inter_token_latency_seconds",
            "Per token after the first chunk: the gap between verified chunks over their tokens.",
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.wait = Histogram(
            "specmarket_draft_wait_seconds",
            "Per draft round: the time decoding waited for drafts (sending the context, the deadline).",
            buckets=TOKEN_BUCKETS,
            registry=self.registry,
        )
        self.responses = Counter(
            "specmarket_http_responses",
            "HTTP responses sent, by status code.",
            ["code"],
            registry=self.registry,
        )
        engine.observers.append(self)

    def response(self, status: int) -> None:
        self.responses.labels(code=str(status)).inc()

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def draft_wait(self, seconds: float) -> None:
        self.wait.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
