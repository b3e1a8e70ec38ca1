"""Process runtime shared by every long-running role and by the lab: data directories, logging
set-up, the start-up heap freeze, signal handling, and holding a port until its server binds.

It belongs to no role: the CLI calls it to run a node, the lab calls it to run its children and
its own timed work, and product code may call it; it imports nothing of the project but the root
exception.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import signal
import socket
import sys
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
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LINE_BREAK = " | "  # what a line break inside one event (a traceback, a warning's source line) becomes


def default_data_dir(role: str) -> Path:
    """Where a role keeps its state unless told otherwise: $XDG_DATA_HOME/specmarket/ROLE
    (default ~/.local/share/specmarket/ROLE), never inside the repository."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "specmarket" / role


class OneLineFormatter(logging.Formatter):
    """LOG_FORMAT, one event per line: a multi-line message or traceback is folded into the line
    of its record (line breaks become LINE_BREAK), so every line of the log starts with its time."""

    def format(self, record: logging.LogRecord) -> str:
        return LINE_BREAK.join(super().format(record).splitlines())


def stderr_handler(level: int = logging.NOTSET) -> logging.Handler:
    """A handler writing one-line, timestamped records to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    handler.setLevel(level)
    return handler


def _is_console(handler: logging.Handler) -> bool:
    stream = getattr(handler, "stream", None)
    consoles = (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)
    return (
        isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
        and stream in consoles
    )


def _adopt_library_loggers() -> None:
    """Route the libraries' loggers through the root's handler. py-libp2p, on import, empties its
    ``libp2p`` logger and stops it propagating, so its records reached stderr through logging's
    last resort, a bare message without a time; transformers and torch give theirs a console
    handler of their own, with their own format (transformers' is installed on first use, which
    comes later, when a role loads its models: it is switched off here)."""
    if importlib.util.find_spec("transformers") is not None:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.enable_propagation()
    libp2p = logging.getLogger("libp2p")
    if not libp2p.handlers:
        libp2p.propagate = True
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):
            continue
        if any(map(_is_console, logger.handlers)):
            logger.handlers = [h for h in logger.handlers if not _is_console(h)]
            logger.propagate = True
        if logger.name.startswith(tuple(f"{noisy}." for noisy in NOISY_LOGGERS)):
            logger.setLevel(logging.NOTSET)  # inherit the library's level: py-libp2p sets INFO on some modules


def node_logging(verbose: bool) -> None:
    """INFO for specmarket's own loggers (DEBUG with ``verbose``), WARNING for chatty libraries,
    every record in one timestamped, one-line format: the libraries' loggers are routed through the
    root's handler, Python warnings are logged, and a record no handler takes (its logger stops
    propagating) gets the format too. Call it once the role's modules are imported."""
    root = logging.getLogger()
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not root.handlers:
        root.addHandler(stderr_handler())
    _adopt_library_loggers()
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger(SILENCED_LOGGER).setLevel(logging.DEBUG if verbose else logging.CRITICAL)
    logging.lastResort = stderr_handler(logging.WARNING)
    logging.captureWarnings(True)


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
