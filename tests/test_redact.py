"""An RPC URL's API key never reaches a client, a log or a terminal (node.runtime.redact).

A hosted endpoint carries its key in the URL (``https://…/v3/<key>``), and requests' errors quote
the URL whole ("429 Client Error: Too Many Requests for url: …"). The end-to-end test puts a
bonded target process behind a stub RPC at ``/v3/SECRET`` that forwards to anvil, then answers
429: the reason the node stops serving must reach /health, the dashboard, /metrics, the 503 body,
the libp2p error frame and the log, each without the key.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from httputil import post_json
from httputil import request as http_request
from netutil import start_target

from node.runtime.logs import OneLineFormatter
from node.runtime.redact import describe, redact

SECRET = "SECRET0123456789"
KEY_PATH = f"/v3/{SECRET}"
RATE_LIMITED = 429
UNAVAILABLE = 503
STANDING_WAIT_S = 30.0  # the node asks the chain every 5 s (node.chain.standing.STANDING_POLL_S)
FORWARD_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 120


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            f"429 Client Error: Too Many Requests for url: https://mainnet.example.io/v3/{SECRET}",
            "429 Client Error: Too Many Requests for url: https://mainnet.example.io/…",
        ),
        (f"at wss://user:{SECRET}@rpc.example.io:8546/ws, twice", "at wss://rpc.example.io:8546/…, twice"),
        (f"('http://[::1]:8545/?key={SECRET}', 3)", "('http://[::1]:8545/…', 3)"),
        ("served at http://127.0.0.1:8000 since", "served at http://127.0.0.1:8000 since"),
        ("no address here: 127.0.0.1/v3/x", "no address here: 127.0.0.1/v3/x"),
        ("only http://127.0.0.1:PORT can be started", "only http://127.0.0.1:PORT can be started"),  # a placeholder
    ],
)
def test_redact_keeps_where_and_drops_the_key(text, shown):
    assert redact(text) == shown


def test_an_exception_and_a_logged_traceback_are_redacted():
    try:
        raise ConnectionError(f"HTTPSConnectionPool: Max retries exceeded with url: https://h.example/v2/{SECRET}")
    except ConnectionError as exc:
        error = exc
        record = logging.LogRecord("x", logging.WARNING, __file__, 1, "failed: %s", (exc,), sys.exc_info())
    assert SECRET not in describe(error) and describe(error).startswith("ConnectionError: HTTPSConnectionPool")
    line = OneLineFormatter("%(levelname)s %(message)s").format(record)
    assert SECRET not in line and "Traceback" in line and "https://h.example/…" in line


class _StubRpc(BaseHTTPRequestHandler):
    """Forwards JSON-RPC posted at KEY_PATH to anvil; answers 429, as a hosted endpoint over its
    rate limit does, once ``failing`` is set."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        server: _StubServer = self.server  # type: ignore[assignment]
        if server.failing.is_set() or self.path != KEY_PATH:
            self._reply(RATE_LIMITED, b"Too Many Requests", "text/plain")
            return
        forward = urllib.request.Request(server.upstream, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(forward, timeout=FORWARD_TIMEOUT_S) as answer:
            self._reply(200, answer.read(), "application/json")

    def _reply(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # quiet
        pass


class _StubServer(ThreadingHTTPServer):
    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _StubRpc)
        self.upstream, self.failing = upstream, threading.Event()


@contextmanager
def stub_rpc(upstream: str) -> Iterator[tuple[str, threading.Event]]:
    server = _StubServer(upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{KEY_PATH}", server.failing
    finally:
        server.shutdown()
        server.server_close()


def _wait_unavailable(http: str) -> tuple[int, bytes]:
    deadline = time.monotonic() + STANDING_WAIT_S
    while True:
        status, _, body = http_request(http, "GET", "/health")
        if status == UNAVAILABLE or time.monotonic() > deadline:
            return status, body
        time.sleep(0.2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node", *args], capture_output=True, text=True, timeout=CLI_TIMEOUT_S)


def test_an_rpc_key_reaches_no_body_frame_or_log_line(chain, tmp_path):
    with stub_rpc(chain.rpc) as (rpc, failing):
        target = start_target(tmp_path, "--chain", rpc, "--deployments", str(chain.deployments), "--max-drafters", "0")
        try:
            http = target.lines["http"][0]
            failing.set()
            status, health = _wait_unavailable(http)
            assert status == UNAVAILABLE and b"429" in health, health  # the reason, key aside, does reach it
            bodies = {"/health": health}
            for path in ("/api/dashboard", "/metrics"):
                bodies[path] = http_request(http, "GET", path)[2]
            status, answer = post_json(http, {"prompt": "x =", "max_tokens": 2})
            assert status == UNAVAILABLE
            bodies["503"] = json.dumps(answer).encode()
            ask = _cli("ask", "--target", target.lines["multiaddr"][0], "x =", "--max-new-tokens", "2")
            assert ask.returncode == 2 and "429" in ask.stderr, ask.stderr  # the target's error frame
            status_cli = _cli("chain", "status", "--rpc", rpc, "--deployments", str(chain.deployments))
            assert status_cli.returncode == 2 and "127.0.0.1" in status_cli.stderr, status_cli.stderr
        finally:
            target.stop()
    for where, body in bodies.items():
        assert SECRET.encode() not in body, f"{where}: {body[:500]!r}"
    assert SECRET not in ask.stderr and SECRET not in status_cli.stderr, (ask.stderr, status_cli.stderr)
    log = target.log()
    assert "429" in log and SECRET not in log, [line for line in log.splitlines() if SECRET in line][:3]
