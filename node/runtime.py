"""Process runtime shared by every long-running role and by the lab: data directories, logging
set-up, the start-up heap freeze, signal handling, and holding a port until its server binds.

It belongs to no role: the CLI calls it to run a node, the lab calls it to run its children and
its own timed work, and product code may call it; it imports nothing of the project but the root
exception.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import trio

from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

GRACE_S = 5.0  # time a node gets to wind down (a drafter: withdraw its registration) after Ctrl-C
NOISY_LOGGERS = ("libp2p", "multiaddr", "hypercorn", "transformers", "httpx")
# py-libp2p 0.8.1's rendezvous service logs an ERROR with an empty message each time a client
# closes its stream after a (successful) registration; kept out of the operator's log.
SILENCED_LOGGER = "libp2p.discovery.rendezvous.service"


def default_data_dir(role: str) -> Path:
    """Where a role keeps its state unless told otherwise: $XDG_DATA_HOME/specmarket/ROLE
    (default ~/.local/share/specmarket/ROLE), never inside the repository."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "specmarket" / role


def node_logging(verbose: bool) -> None:
    """INFO for specmarket's own loggers (DEBUG with ``verbose``), WARNING for chatty libraries."""
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger(SILENCED_LOGGER).setLevel(logging.DEBUG if verbose else logging.CRITICAL)


def freeze_startup_heap() -> None:
    """Call once a long-running process has loaded its models: move the ~500k objects that torch,
    transformers and libp2p leave behind into the collector's permanent generation (``gc.freeze``,
    Python 3.7+). Full collections then skip them, which removes ~0.5 s pauses while serving and
    makes interpreter shutdown fast: without it every target, drafter and referee spent 2-10 s
    garbage-collecting at exit (measured with py-spy on a 2-core box, 10 s with 11 processes)."""
    gc.collect()
    gc.freeze()


Service = Callable[..., Awaitable[Any]]  # run(*, task_status) -> None, reports where it serves


async def serve_until_signalled(
    run: Service, announce: Callable[[Any], None], request_stop: Callable[[], None] | None = None
) -> None:
    """Run ``run`` until SIGINT/SIGTERM, or until it returns; ``announce(info)`` prints where it
    serves. A signal is honoured at every stage: during start-up (a drafter retrying an unreachable
    target, a target bonding) it cancels at once; once started, ``request_stop()`` (if given) gets
    GRACE_S to wind down before everything is cancelled."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            done, ready = trio.Event(), trio.Event()

            async def serve(task_status=trio.TASK_STATUS_IGNORED) -> None:
                await run(task_status=task_status)
                done.set()
                nursery.cancel_scope.cancel()

            async def start() -> None:
                info = await nursery.start(serve)
                freeze_startup_heap()
                announce(info)
                ready.set()

            nursery.start_soon(start)
            async for signum in signals:
                log.info("received %s; shutting down", signal.Signals(signum).name)
                if request_stop is not None and ready.is_set():
                    request_stop()
                    with trio.move_on_after(GRACE_S):
                        await done.wait()
                nursery.cancel_scope.cancel()
                break


class PortInUse(SpecmarketError):
    """A HOST:PORT this process was told to serve on cannot be bound (taken, or not this machine's)."""


@asynccontextmanager
async def holding_port(host: str, port: int, what: str) -> AsyncIterator[socket.socket]:
    """Bind ``host:port`` (without listening) and hold it, so that a port someone else has fails a
    start before anything irrevocable (a node bonding on chain); close the socket right before the
    real server binds. Bound with SO_REUSEADDR, as servers bind: a port in TIME_WAIT is free."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise PortInUse(f"cannot serve {what} on {host}:{port}: {exc}") from None
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}") from None
        yield sock


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
