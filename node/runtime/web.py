"""One JSON answer over HTTP, bounded in size and time: what every side of the system asks of
another's HTTP API (a drafter of its target's /health, a client of a completion, the lab)."""

from __future__ import annotations

import json
import urllib.request

from p2p import safe_json

MAX_ANSWER_BYTES = 64 << 20
HTTP_TIMEOUT_S = 300.0  # one completion on a busy 2-core machine


def http_json(
    url: str, body: dict | None = None, timeout_s: float = HTTP_TIMEOUT_S, max_bytes: int = MAX_ANSWER_BYTES
) -> dict:
    """GET ``url`` (or POST ``body`` as JSON) and decode the JSON answer (at most ``max_bytes``)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return safe_json.loads(resp.read(max_bytes), f"the answer from {url}")
