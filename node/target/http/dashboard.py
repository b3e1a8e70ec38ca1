"""What an operator sees: the node's condition, the dashboard's JSON, and one log line per error answer.

Everything here reads state the node keeps anyway (the engine's counters and job history, the
market's registry, the operator's standing); nothing is a second source of truth, and nothing
writes.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from node.target.engine import Engine
from node.target.http.metrics import MAX_LISTED_DRAFTERS, ApiMetrics

log = logging.getLogger(__name__)

DRAFTER_FIELDS = (  # a drafter's row on the dashboard: fields of the registry's snapshot
    "proposed",
    "matched",
    "credited_tokens",
    "late",
    "timeouts",
    "errors",
    "refusals",
    "match_rate",
    "benched",
    "bench_remaining_s",
    "bench_reason",
    "latency_ms",
    "busy",
    "jobs",
    "last_error",
)
MAX_LOGGED_ERROR_BYTES = 4096  # of an error answer's body, read for its message
MAX_LOGGED_MESSAGE_CHARS = 200


def node_condition(view: dict[str, Any]) -> tuple[str, str]:
    """("ok", "") while the node can serve and honour its receipts, else ("unavailable", why)."""
    operator = view.get("operator")
    if isinstance(operator, dict) and not operator.get("serving", True):
        return "unavailable", str(operator.get("reason") or "the operator may not sign receipts")
    return "ok", ""


def dashboard_view(engine: Engine, view: dict[str, Any], started: float) -> dict[str, Any]:
    """The dashboard's JSON: the node, its counters, drafters, last jobs and operator."""
    drafters = view.get("drafters") if isinstance(view.get("drafters"), dict) else {}
    rows = {
        peer: {key: row.get(key) for key in DRAFTER_FIELDS}
        for peer, row in list(drafters.items())[:MAX_LISTED_DRAFTERS]
        if isinstance(row, dict)
    }
    status, reason = node_condition(view)
    return {
        "model": engine.model_name,
        "peer_id": view.get("peer_id"),
        "multiaddrs": view.get("multiaddrs") or [],
        "now": time.time(),
        "uptime_s": round(time.monotonic() - started, 3),
        "status": status,
        "reason": reason,
        "counters": engine.counters.snapshot(),
        "drafters": rows,
        "drafters_total": view.get("drafters_total", len(drafters)),
        "jobs": engine.history.to_json(),
        "operator": view.get("operator"),
    }


class ResponseLog:
    """ASGI middleware: counts every response by status code (``specmarket_http_responses_total``)
    and logs each error answer in one line, with the message the client was given: 4xx at INFO
    (the client's mistake), 5xx at WARNING."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        answer = _Answer(scope)

        async def observed(message: Message) -> None:
            answer.see(message)
            await send(message)

        try:
            await self.app(scope, receive, observed)
        except Exception:
            answer.status = answer.status or 500  # the app's last-resort handler answers 500
            raise
        finally:
            if answer.status:
                self.metrics.response(answer.status)
                answer.log()


class _Answer:
    """What one response said: its status and, for an error, the start of its body."""

    def __init__(self, scope: Scope) -> None:
        self.where = f"{scope.get('method', '?')} {scope.get('path', '?')}"
        self.status = 0
        self.body = b""

    def see(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        elif message["type"] == "http.response.body" and self.status >= 400:
            self.body = (self.body + message.get("body", b""))[:MAX_LOGGED_ERROR_BYTES]

    def message(self) -> str:
        try:
            error = json.loads(self.body.decode("utf-8", "replace"))["error"]
            return str(error.get("message", ""))[:MAX_LOGGED_MESSAGE_CHARS]
        except (ValueError, KeyError, TypeError, AttributeError):
            return ""

    def log(self) -> None:
        if self.status >= 500:
            log.warning("HTTP %d for %s: %s", self.status, self.where, self.message() or "(no message)")
        elif self.status >= 400:
            log.info("HTTP %d for %s: %s", self.status, self.where, self.message() or "(no message)")
