"""Holding a port from start-up until its server binds, so that a taken port fails a start early."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from verifier.errors import SpecmarketError


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
