"""`specmarket` child processes (target, drafter) for the networked demo and the tests.

Each child prints ``key: value`` lines on stdout when it is ready (``multiaddr``, ``http``,
``registered``); its log goes to a file. ``ProcessGroup`` stops every child it started, on any
exit of its ``with`` block (an error or Ctrl-C included): SIGTERM to all at once (drafters then
withdraw their registrations in parallel), SIGKILL for those still running after the grace.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from verifier.errors import SpecmarketError

STARTUP_TIMEOUT_S = 120.0  # importing torch and loading models on a busy 2-core machine
STOP_TIMEOUT_S = 15.0
HTTP_TIMEOUT_S = 300.0  # one completion on a busy 2-core machine
DRAFTERS_TIMEOUT_S = 30.0
SPECMARKET = [sys.executable, "-m", "node"]
CHILD_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


class ProcessFailed(SpecmarketError):
    """A child process exited or stayed silent before it was ready."""


@dataclass
class NodeProcess:
    proc: subprocess.Popen
    log_path: Path
    lines: dict[str, list[str]] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, sig: int = signal.SIGTERM) -> int:
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


def spawn(
    args: list[str],
    log_path: Path,
    expect: tuple[str, ...],
    timeout_s: float = STARTUP_TIMEOUT_S,
    group: ProcessGroup | None = None,
) -> NodeProcess:
    """Start ``specmarket *args`` and wait until it has printed every key in ``expect``. With a
    ``group``, the child joins it as soon as it exists, so an interrupted start-up leaves no orphan."""
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*SPECMARKET, *args], stdout=subprocess.PIPE, stderr=log, text=True, env={**os.environ, **CHILD_ENV}
        )
    node = NodeProcess(proc, log_path)
    if group is not None:
        group.add(node)
    lines = _stdout_lines(proc)
    deadline = time.monotonic() + timeout_s
    while not all(k in node.lines for k in expect):
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            node.kill()
            raise ProcessFailed(f"{args[0]} did not start within {timeout_s:.0f} s:\n{node.log()[-3000:]}") from None
        if line is None:
            with suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT_S)  # stdout closed: it is exiting; show its exit code
            raise ProcessFailed(f"{args[0]} exited ({proc.poll()}) before starting:\n{node.log()[-3000:]}")
        key, _, value = line.strip().partition(": ")
        node.lines.setdefault(key, []).append(value)
    return node


def _stdout_lines(proc: subprocess.Popen) -> queue.Queue[str | None]:
    """The child's stdout, line by line, then None at EOF, read by a daemon thread for the child's
    whole life: the start-up wait can time out on a silent child, and a chatty child never blocks
    on a full pipe."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name=f"stdout-{proc.pid}", daemon=True).start()
    return lines


def start_target(workdir: Path, *extra: str, name: str = "target", group: ProcessGroup | None = None) -> NodeProcess:
    args = ["target", "--http", "127.0.0.1:0", "--data-dir", str(workdir / name), *extra]
    return spawn(args, workdir / f"{name}.log", ("multiaddr", "http"), group=group)


def start_drafter(
    workdir: Path, bootstrap: str, strategy: str, name: str, *extra: str, group: ProcessGroup | None = None
) -> NodeProcess:
    args = ["drafter", "--bootstrap", bootstrap, "--strategy", strategy, "--data-dir", str(workdir / name), *extra]
    return spawn(args, workdir / f"{name}.log", ("registered",), group=group)


def http_json(url: str, body: dict | None = None, timeout_s: float = HTTP_TIMEOUT_S) -> dict:
    """GET ``url`` (or POST ``body`` as JSON) and decode the JSON answer."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def complete(http: str, prompt: str, *, seed: int, max_tokens: int, temperature: float = 1.0, **kw) -> dict:
    """One non-streaming completion from a target's OpenAI-compatible API."""
    body = {"prompt": prompt, "seed": seed, "max_tokens": max_tokens, "temperature": temperature, **kw}
    return http_json(f"{http}/v1/completions", body)


def wait_for_drafters(http: str, n: int, timeout_s: float = DRAFTERS_TIMEOUT_S) -> dict:
    """Poll /health until the target knows at least ``n`` drafters; its /health then."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = http_json(f"{http}/health", timeout_s=10.0)
        if len(health.get("drafters", {})) >= n:
            return health
        if time.monotonic() > deadline:
            raise ProcessFailed(f"the target at {http} knows {len(health.get('drafters', {}))} drafters, expected {n}")
        time.sleep(0.2)


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt like Ctrl-C does, so ``with`` blocks stop their children."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupt) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


class ProcessGroup:
    """Children started inside ``with ProcessGroup() as group`` are all stopped when it exits."""

    def __init__(self) -> None:
        self.children: list[NodeProcess] = []
        self.closed = False

    def add(self, node: NodeProcess) -> NodeProcess:
        self.children.append(node)
        if self.closed:  # a start-up thread that lost the race with stop_all: no orphan
            node.stop()
        return node

    def start_all(self, starters: list[Callable[..., NodeProcess]]) -> list[NodeProcess]:
        """Start several children in parallel (their start-up is mostly imports and model loading).
        Each ``starter(group=self)`` joins the group the moment its process exists; a start-up
        error is raised as soon as it is seen, and the others are stopped with the group."""
        pool = ThreadPoolExecutor(max_workers=len(starters))
        try:
            futures = [pool.submit(start, group=self) for start in starters]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # on Ctrl-C, don't wait: stop_all ends them

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.stop_all()

    def stop_all(self) -> None:
        self.closed = True
        children = list(self.children)
        for child in children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
        self.children.clear()
