"""A flaky link on loopback: a userspace TCP proxy that delays, jitters and cuts (issue 42 §2).

The kernel here has no ``netem``, so tests and benches put this proxy between a client and a target:
every chunk that crosses it, each way, is held for ``delay_ms`` ± ``jitter_ms`` (one way: the round
trip gains twice that), in order (a later chunk never overtakes an earlier one, as on one TCP
connection), and the link can be cut once, mid-answer, after ``cut_after_bytes`` bytes have crossed
it towards the client: both sides of that connection are closed at once, as a dropped link would be
seen by each (later connections pass).

Bytes are never dropped or reordered inside a connection: TCP would retransmit them, which shows as
delay. What a lossy link adds beyond delay, the stall of a lost segment, is the jitter's tail.
"""

from __future__ import annotations

import contextlib
import logging
import random
from dataclasses import dataclass, field

import trio

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
MAX_DELAY_MS = 10_000.0


class LinkError(ValueError):
    """A link configuration that makes no sense."""


@dataclass(frozen=True)
class LinkConfig:
    delay_ms: float = 0.0  # one way; the round trip gains twice this
    jitter_ms: float = 0.0  # each chunk's delay is uniform in delay ± jitter (never below 0)
    cut_after_bytes: int | None = None  # close the first connection that carries this many bytes to the client
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("delay_ms", "jitter_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_DELAY_MS:
                raise LinkError(f"{name} must be in [0, {MAX_DELAY_MS}] ms, got {value!r}")
        cut = self.cut_after_bytes
        if cut is not None and (isinstance(cut, bool) or not isinstance(cut, int) or cut < 1):
            raise LinkError(f"cut_after_bytes must be a positive int or None, got {cut!r}")

    @property
    def rtt_ms(self) -> float:
        return 2 * self.delay_ms


@dataclass
class LinkStats:
    connections: int = 0
    bytes_to_client: int = 0
    bytes_to_server: int = 0
    cuts: int = 0
    delays_ms: list[float] = field(default_factory=list)  # of the chunks held, for the bench's report


class FlakyLink:
    """One proxy: ``serve`` listens on 127.0.0.1 and forwards each connection to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], cfg: LinkConfig) -> None:
        self.upstream, self.cfg = upstream, cfg
        self.stats = LinkStats()
        self.port: int | None = None
        self._rng = random.Random(cfg.seed)
        self._cut_done = cfg.cut_after_bytes is None

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.stats.connections += 1
        try:
            server = await trio.open_tcp_stream(*self.upstream)
        except OSError as exc:
            log.info("flaky link: upstream %s:%d refused: %s", *self.upstream, exc)
            await client.aclose()
            return
        async with client, server, trio.open_nursery() as nursery:
            cut = nursery.cancel_scope  # the cut ends both directions at once; both sockets close
            nursery.start_soon(self._pump, client, server, False, cut)
            nursery.start_soon(self._pump, server, client, True, cut)

    async def _pump(self, source, sink, to_client: bool, cut: trio.CancelScope) -> None:
        """Read from ``source`` and write each chunk to ``sink`` once its delay has passed, in order."""
        send, receive = trio.open_memory_channel[tuple[float, bytes]](256)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._deliver, receive, sink, to_client, cut)
            async with send:
                while True:
                    try:
                        data = await source.receive_some(CHUNK_BYTES)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        data = b""
                    if not data:
                        break
                    await send.send((trio.current_time() + self._delay_s(), data))
        with trio.move_on_after(1.0), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await sink.send_eof()  # the other side sees the end of this direction

    async def _deliver(self, receive, sink, to_client: bool, cut: trio.CancelScope) -> None:
        due_last = 0.0
        async for due, data in receive:
            due_last = max(due_last, due)  # in order: never before the chunk ahead of it
            await trio.sleep_until(due_last)
            if to_client and not self._cut_done:
                room = self.cfg.cut_after_bytes - self.stats.bytes_to_client
                if len(data) >= room:
                    data = data[:room]
                    self._cut_done = True
                    await self._write(sink, data)
                    self.stats.bytes_to_client += len(data)
                    self.stats.cuts += 1
                    log.info("flaky link: cut after %d bytes to the client", self.stats.bytes_to_client)
                    cut.cancel()
                    return
            if not await self._write(sink, data):
                return
            if to_client:
                self.stats.bytes_to_client += len(data)
            else:
                self.stats.bytes_to_server += len(data)

    @staticmethod
    async def _write(sink, data: bytes) -> bool:
        try:
            await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        return True

    def _delay_s(self) -> float:
        cfg = self.cfg
        ms = max(0.0, cfg.delay_ms + self._rng.uniform(-cfg.jitter_ms, cfg.jitter_ms))
        self.stats.delays_ms.append(ms)
        return ms / 1000.0
