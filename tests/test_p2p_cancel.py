"""A cancelled write must not cost the connection (p2p/secure.py), on real Noise hosts over loopback.

Noise encrypts under a counter nonce before the socket write. py-libp2p's session yields once
between the two, so a task cancelled there (a drafting session that ended, a job that finished)
spent a nonce and sent nothing: the peer then failed to decrypt every later message and dropped the
connection with every stream on it. A drafter lost its connection to the target that way in
about one run in six of test_overlap, and the next job ran without it. The sweep below cancels a
writer after each number of scheduler steps up to CANCEL_STEPS, several times each, so the cancellation lands at
every await of the write path, that one included; then the connection must still carry a round trip.
"""

from __future__ import annotations

import contextlib

import pytest
import trio
from libp2p.abc import INetStream
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.exceptions import BaseLibp2pError
from libp2p.io.exceptions import ConnectionClosedError

from p2p import secure
from p2p.host import make_host, parse_listen, parse_peer_addr, peer_addrs
from p2p.secure import AtomicWrites

ECHO = "/specmarket/test-echo/1.0.0"
CANCEL_STEPS = 12  # more awaits than a small write makes through yamux, Noise and the socket
REPEATS = 8  # trio varies the order of runnable tasks: each step is tried several times
PAYLOAD = b"x" * 64
ROUND_TRIP_TIMEOUT_S = 5.0


async def _echo(stream: INetStream) -> None:
    try:
        while data := await stream.read(1024):
            if data.endswith(b"?"):
                await stream.write(b"pong")
    except BaseLibp2pError:
        pass


async def _write(stream: INetStream, scope: trio.CancelScope) -> None:
    with scope, contextlib.suppress(BaseLibp2pError):  # the connection is gone: the round trip says so
        await stream.write(PAYLOAD)


async def _cancelled_writes(stream: INetStream) -> None:
    for steps in range(CANCEL_STEPS):
        for _ in range(REPEATS):
            scope = trio.CancelScope()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_write, stream, scope)
                for _ in range(steps):
                    await trio.sleep(0)
                scope.cancel()


async def _round_trip(stream: INetStream) -> bytes:
    with trio.fail_after(ROUND_TRIP_TIMEOUT_S):
        await stream.write(b"ping?")
        return await stream.read(4)


async def _scenario() -> tuple[bytes, bool]:
    listen = [parse_listen("/ip4/127.0.0.1/tcp/0")]
    client, server = make_host(create_new_key_pair()), make_host(create_new_key_pair())
    async with client.run(listen_addrs=listen), server.run(listen_addrs=listen):
        server.set_stream_handler(ECHO, _echo)
        await client.connect(parse_peer_addr(peer_addrs(server)[0]))
        stream = await client.new_stream(server.get_id(), [ECHO])
        await _cancelled_writes(stream)
        await trio.sleep(0.2)  # the server has read (and, before the fix, choked on) every frame
        try:  # on the same stream, so on the same connection (a new stream could dial a new one)
            answer = await _round_trip(stream)
        except (BaseLibp2pError, trio.TooSlowError) as exc:
            answer = f"no round trip: {type(exc).__name__}: {exc}".encode()
        return answer, not stream.muxed_conn.is_closed


def test_a_write_cancelled_at_any_point_leaves_the_connection_usable_succeeds():
    answer, alive = trio.run(_scenario)
    assert answer == b"pong" and alive, (answer, alive)


class StuckSession:
    """A secure session whose writes take ``write_s`` (a peer that stopped reading: the socket is
    full); it records what was written whole and whether it was closed."""

    def __init__(self, write_s: float) -> None:
        self.write_s, self.written, self.closed = write_s, [], False

    async def write(self, data: bytes) -> None:
        await trio.sleep(self.write_s)
        self.written.append(data)

    async def close(self) -> None:
        self.closed = True

    def get_remote_peer(self) -> str:
        return "peer"


def test_a_write_outlives_a_cancel_and_finishes_whole_succeeds():
    session = StuckSession(write_s=0.05)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(AtomicWrites(session).write, b"frame")
            await trio.sleep(0.01)
            nursery.cancel_scope.cancel()  # mid-write: the frame still goes out whole

    trio.run(main)
    assert session.written == [b"frame"] and not session.closed


def test_a_write_already_cancelled_sends_nothing_succeeds():
    session = StuckSession(write_s=0.0)

    async def main() -> None:
        with trio.CancelScope() as scope:
            scope.cancel()
            await AtomicWrites(session).write(b"frame")

    trio.run(main)
    assert session.written == [] and not session.closed  # nothing encrypted, nothing to close


def test_a_write_past_its_callers_deadline_closes_the_connection_reverts():
    session = StuckSession(write_s=60.0)

    async def main() -> None:
        with trio.fail_after(0.1):
            await AtomicWrites(session).write(b"frame")

    with pytest.raises(trio.TooSlowError):
        trio.run(main)
    assert session.written == [] and session.closed


def test_a_write_without_a_deadline_is_bounded_and_closes_the_connection_reverts(monkeypatch):
    monkeypatch.setattr(secure, "WRITE_DEADLINE_S", 0.1)
    session = StuckSession(write_s=60.0)
    with pytest.raises(ConnectionClosedError, match=r"longer than 0\.1 s"):
        trio.run(AtomicWrites(session).write, b"frame")
    assert session.closed
