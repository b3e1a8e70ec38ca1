"""Helpers for tests of the target's HTTP API: apps served by real hypercorn on loopback (one trio
loop in a background thread, since the official ``openai`` sync client blocks), raw requests, and
/metrics read with prometheus_client's own parser."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Iterator
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import openai
import trio
from prometheus_client.parser import text_string_to_metric_families

from node.target.http.api import serve_http

MODEL = "specmarket-target"


@contextlib.contextmanager
def serving(apps: dict[str, Any]) -> Iterator[dict[str, str]]:
    """name -> base URL of each app, each on a free loopback port, until the block ends."""
    urls: dict[str, str] = {}
    box: dict[str, Any] = {}
    ready = threading.Event()

    async def main() -> None:
        box["token"] = trio.lowlevel.current_trio_token()
        box["stop"] = stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for name, app in apps.items():
                urls[name] = await nursery.start(partial(serve_http, app, "127.0.0.1", 0, shutdown_trigger=stop.wait))
            ready.set()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            box["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, name="http-api-test-server", daemon=True)
    thread.start()
    assert ready.wait(30), "the HTTP server did not start"
    if "error" in box:
        raise box["error"]
    yield urls
    trio.from_thread.run_sync(box["stop"].set, trio_token=box["token"])
    thread.join(15)
    assert not thread.is_alive(), "the HTTP server did not shut down"
    assert "error" not in box, box.get("error")


def request(url: str, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """A raw HTTP request: (status, lower-cased headers, body bytes)."""
    conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=30)
    try:
        # a server may answer (413) before it has read all of a large body
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request(method, path, body=body, headers=headers or {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def post_json(url: str, body: Any, path: str = "/v1/completions") -> tuple[int, dict]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, _, data = request(url, "POST", path, raw)
    return status, json.loads(data)


def sync_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def parse_metrics(text: str) -> tuple[dict[str, float], dict[str, str]]:
    """(sample -> value, sample name -> type), read with prometheus_client's own parser; a sample is
    keyed by its name and labels, e.g. ``specmarket_drafter_latency_ms{peer="12D3KooWDrafterA"}``."""
    samples: dict[str, float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        assert family.type != "unknown", f"{family.name} has no # TYPE line"
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
            types[sample.name] = family.type
    return samples, types


def metrics(url: str) -> tuple[dict[str, float], dict[str, str], str]:
    status, headers, raw = request(url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    return *parse_metrics(raw.decode()), raw.decode()
