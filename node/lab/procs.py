"""`specmarket` child processes (target, drafter) for the networked demo and the tests.

Each child prints ``key: value`` lines on stdout when it is ready (``multiaddr``, ``http``,
``registered``); its log goes to a file. ``ProcessGroup`` stops every child it started, on any
exit of its ``with`` block (an error or Ctrl-C included): SIGTERM to all at once (drafters then
withdraw their registrations in parallel), SIGKILL for those still running after the grace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from node.client.http import http_json
from node.model.pairs import DEFAULT_PAIR
from verifier.errors import SpecmarketError

STARTUP_TIMEOUT_S = 120.0  # importing torch and loading models on a busy 2-core machine
STOP_TIMEOUT_S = 15.0
DRAFTERS_TIMEOUT_S = 30.0
SPECMARKET = [sys.executable, "-m", "node"]
CHILD_ENV = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


class ProcessFailed(SpecmarketError):
    """A child process exited or stayed silent before it was ready."""


@dataclass
class NodeProcess:
    """A child ``specmarket`` process. Its stdout lines ``key: value`` are collected into ``lines``
    by a daemon thread for the child's whole life (so a chatty child never blocks on a full pipe)."""

    proc: subprocess.Popen
    log_path: Path
    lines: dict[str, list[str]] = field(default_factory=dict)
    _changed: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _stdout_closed: bool = False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start_reading(self) -> None:
        threading.Thread(target=self._pump, name=f"stdout-{self.proc.pid}", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                key, _, value = line.strip().partition(": ")
                with self._changed:
                    self.lines.setdefault(key, []).append(value)
                    self._changed.notify_all()
        finally:
            with self._changed:
                self._stdout_closed = True
                self._changed.notify_all()

    def wait_until(self, ready: Callable[[dict[str, list[str]]], bool], timeout_s: float) -> bool:
        """Until ``ready(lines)`` holds (True), or the child closed its stdout or ``timeout_s``
        passed without it (False; ``exited()`` tells which)."""
        with self._changed:
            return self._changed.wait_for(lambda: ready(self.lines) or self._stdout_closed, timeout_s) and ready(
                self.lines
            )

    def exited(self) -> bool:
        """The child closed its stdout (it is exiting); its exit code is then in ``proc``."""
        with self._changed:
            closed = self._stdout_closed
        if closed:
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_TIMEOUT_S)
        return closed

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def join(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Wait for an exit already asked for, without a second signal (a node that has begun
        winding down is killed by a second SIGTERM, as by a second Ctrl-C); SIGKILL after
        ``timeout_s``."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
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
    cpus: frozenset[int] | None = None,
) -> NodeProcess:
    """Start ``specmarket *args`` and wait until it has printed every key in ``expect``. With a
    ``group``, the child joins it as soon as it exists, so an interrupted start-up leaves no orphan.
    With ``cpus``, the child runs on those cores only (``sched_setaffinity``, before it starts)."""
    pin = None if cpus is None else partial(os.sched_setaffinity, 0, cpus)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*SPECMARKET, *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, **CHILD_ENV},
            preexec_fn=pin,
        )
    node = NodeProcess(proc, log_path)
    if group is not None:
        group.add(node)
    node.start_reading()
    if node.wait_until(lambda lines: all(k in lines for k in expect), timeout_s):
        return node
    if node.exited():
        raise ProcessFailed(f"{args[0]} exited ({proc.poll()}) before starting:\n{node.log()[-3000:]}")
    node.kill()
    raise ProcessFailed(f"{args[0]} did not start within {timeout_s:.0f} s:\n{node.log()[-3000:]}")


def start_target(
    workdir: Path,
    *extra: str,
    name: str = "target",
    group: ProcessGroup | None = None,
    pair: str = DEFAULT_PAIR,
    cpus: frozenset[int] | None = None,
) -> NodeProcess:
    args = ["target", "--pair", pair, "--http", "127.0.0.1:0", "--data-dir", str(workdir / name), *extra]
    return spawn(args, workdir / f"{name}.log", ("multiaddr", "http", "dashboard"), group=group, cpus=cpus)


def start_drafter(
    workdir: Path,
    bootstrap: str,
    strategy: str,
    name: str,
    *extra: str,
    group: ProcessGroup | None = None,
    pair: str = DEFAULT_PAIR,
    cpus: frozenset[int] | None = None,
) -> NodeProcess:
    args = ["drafter", "--pair", pair, "--bootstrap", bootstrap, "--strategy", strategy]
    args += ["--data-dir", str(workdir / name), *extra]
    return spawn(args, workdir / f"{name}.log", ("registered",), group=group, cpus=cpus)


def core_split() -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """(the targets' cores, the drafters' cores): the first core this process may use for the
    targets, the others for the drafter peers, so that drafting is really offloaded; (None, None)
    on a single core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None, None
    return frozenset(cores[:1]), frozenset(cores[1:])


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


def warm_up_market(
    http: str, n_drafters: int, ask_one: Callable[[int], object], max_jobs: int, *, judge_all: bool = False
) -> int:
    """Short jobs ``ask_one(i)`` (i = 0, 1, ...; not measured) until the target at ``http`` has
    given every one of its ``n_drafters`` drafters a job and judged one that is not benched (its
    ``judge_after_tokens`` offered), or with ``judge_all`` judged every one. A job asks at most one
    untried drafter, so a market reaches its steady state only after a few; returns the jobs sent
    (at most ``max_jobs``)."""
    from node.target.config import TargetConfig

    judge_after = TargetConfig.judge_after_tokens  # the benchmarks' targets run with the default
    for i in range(max_jobs):
        ask_one(i)
        rows = list(http_json(f"{http}/health")["drafters"].values())
        judged = [max(r["offered"], r["proposed"]) >= judge_after and not r["benched"] for r in rows]
        tried = len(rows) >= n_drafters and all(row["jobs"] for row in rows)
        if tried and (all(judged) if judge_all else any(judged)):
            return i + 1
    return max_jobs


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
        if not starters:
            return []
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
