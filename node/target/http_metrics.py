"""``GET /metrics``: the engine's counters, per-drafter series and latency histograms, with
``prometheus_client`` on a registry of the app's own (several nodes can share one process)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from node.target.engine import Engine

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes
METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
GAUGE_SUFFIXES = ("_ms", "_seconds", "_rate", "_ratio", "_score")
ENGINE_METRICS = (  # (EngineCounters field, metric name, counter?, help)
    ("requests", "requests_total", True, "Completion jobs started."),
    ("requests_failed", "requests_failed_total", True, "Completion jobs that failed or were cancelled."),
    ("tokens_generated", "tokens_generated_total", True, "Verified tokens generated."),
    ("target_passes", "target_passes_total", True, "Target model forward passes."),
    ("target_positions", "target_positions_total", True, "Positions scored by the target (prefill included)."),
    ("draft_tokens_proposed", "draft_tokens_proposed_total", True, "Draft tokens proposed by drafters."),
    ("draft_tokens_accepted", "draft_tokens_accepted_total", True, "Draft tokens accepted by verification."),
    ("active_jobs", "active_jobs", False, "Completion jobs running now."),
)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

StatusFn = Callable[[], dict[str, Any]]


def _is_number(value: Any) -> bool:
    return type(value) is int or (type(value) is float and math.isfinite(value))


class EngineCollector:
    """Reads the engine's counters and the node's drafter view at every scrape."""

    def __init__(self, engine: Engine, status: StatusFn) -> None:
        self.engine, self.status = engine, status

    def collect(self) -> Iterator[Metric]:
        counters = self.engine.counters.snapshot()
        for key, name, counter, help_text in ENGINE_METRICS:
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(f"specmarket_{name}", help_text, value=counters.get(key, 0))
        drafters = self.status().get("drafters")
        drafters = drafters if isinstance(drafters, dict) else {}
        yield GaugeMetricFamily("specmarket_drafters_known", "Drafter peers the target knows of.", value=len(drafters))
        yield from _drafter_families(drafters)


def _drafter_families(drafters: dict[str, Any]) -> Iterator[Metric]:
    """One family per numeric drafter field, a sample per peer: counters for integer totals, gauges
    for rates, latencies and any float."""
    series: dict[str, list[tuple[str, int | float]]] = {}
    for peer in sorted(drafters, key=str):
        stats = drafters[peer]
        for key, value in stats.items() if isinstance(stats, dict) else ():
            if isinstance(key, str) and METRIC_NAME.fullmatch(key) and _is_number(value):
                series.setdefault(key, []).append((str(peer), value))
    for key, samples in sorted(series.items()):
        gauge = key.endswith(GAUGE_SUFFIXES) or any(type(v) is float for _, v in samples)
        name = f"specmarket_drafter_{key}" if gauge or key.endswith("_total") else f"specmarket_drafter_{key}_total"
        family = (GaugeMetricFamily if gauge else CounterMetricFamily)(
            name, f"Per-drafter {key.replace('_', ' ')}.", labels=["peer"]
        )
        for peer, value in samples:
            family.add_metric([peer], value)
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
        engine.observers.append(self)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def draft_wait(self, seconds: float) -> None:
        self.wait.observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
