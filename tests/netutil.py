"""Helpers for tests that run real target and drafter processes on loopback."""

from __future__ import annotations

import json
import time
import urllib.request

from node.procs import SPECMARKET, NodeProcess, start_drafter, start_target  # noqa: F401  (re-exported)


def http_json(url: str, body: dict | None = None, timeout_s: float = 120.0) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def wait_for_drafters(http: str, n: int, timeout_s: float = 30.0) -> dict:
    """Poll /health until the target knows at least ``n`` drafters."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = http_json(f"{http}/health")
        if len(health.get("drafters", {})) >= n:
            return health
        if time.monotonic() > deadline:
            raise AssertionError(f"target knows {len(health.get('drafters', {}))} drafters, expected {n}")
        time.sleep(0.2)


def complete(http: str, prompt: str, *, seed: int, max_tokens: int, temperature: float = 1.0, **kw) -> dict:
    body = {"prompt": prompt, "seed": seed, "max_tokens": max_tokens, "temperature": temperature, **kw}
    return http_json(f"{http}/v1/completions", body)
