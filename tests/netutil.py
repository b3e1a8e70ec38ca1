"""Helpers for tests that run real target and drafter processes on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

STARTUP_TIMEOUT_S = 120.0  # importing torch and loading models on a busy 2-core CI machine
SPECMARKET = [sys.executable, "-m", "node"]


@dataclass
class NodeProcess:
    proc: subprocess.Popen
    log_path: Path
    lines: dict[str, list[str]] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 15.0, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _start(args: list[str], log_path: Path, expect: tuple[str, ...]) -> NodeProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    log = log_path.open("w")
    proc = subprocess.Popen([*SPECMARKET, *args], stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    node = NodeProcess(proc, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    assert proc.stdout is not None
    while not all(k in node.lines for k in expect):
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{args[0]} exited ({proc.poll()}) before starting:\n{node.log()[-3000:]}")
        key, _, value = line.strip().partition(": ")
        node.lines.setdefault(key, []).append(value)
        if time.monotonic() > deadline:
            node.kill()
            raise RuntimeError(f"{args[0]} did not start within {STARTUP_TIMEOUT_S} s")
    return node


def start_target(tmp: Path, *extra: str) -> NodeProcess:
    args = ["target", "--http", "127.0.0.1:0", "--data-dir", str(tmp / "target"), *extra]
    return _start(args, tmp / "target.log", ("multiaddr", "http"))


def start_drafter(tmp: Path, bootstrap: str, strategy: str, name: str, *extra: str) -> NodeProcess:
    args = ["drafter", "--bootstrap", bootstrap, "--strategy", strategy, "--data-dir", str(tmp / name), *extra]
    return _start(args, tmp / f"{name}.log", ("registered",))


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
