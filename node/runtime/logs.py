"""Logging set-up for every process: one timestamped line per record, the chatty libraries quieted
and their loggers routed through the root's handler."""

from __future__ import annotations

import importlib.util
import logging
import sys

from node.runtime.redact import redact

NOISY_LOGGERS = ("libp2p", "multiaddr", "hypercorn", "transformers", "httpx")
# py-libp2p 0.8.1's rendezvous service logs an ERROR with an empty message each time a client
# closes its stream after a (successful) registration; kept out of the operator's log.
SILENCED_LOGGER = "libp2p.discovery.rendezvous.service"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LINE_BREAK = " | "  # what a line break inside one event (a traceback, a warning's source line) becomes


class OneLineFormatter(logging.Formatter):
    """LOG_FORMAT, one event per line: a multi-line message or traceback is folded into the line
    of its record (line breaks become LINE_BREAK), so every line of the log starts with its time;
    every URL in it is redacted (node.runtime.redact: an RPC URL's key never reaches a log)."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(LINE_BREAK.join(super().format(record).splitlines()))


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
