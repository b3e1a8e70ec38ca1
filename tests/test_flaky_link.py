"""The flaky link (node.lab.flaky_link) that issue 42's tests and bench put between a client and a
target: it adds the delay it is told each way, keeps the bytes in order under jitter, and cuts one
connection once after the bytes it is told, on real loopback sockets."""

from __future__ import annotations

import time

import pytest
import trio

from node.lab.flaky_link import FlakyLink, LinkConfig, LinkError

PINGS = 10


async def echo_server(*, task_status=trio.TASK_STATUS_IGNORED) -> None:
    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            async for data in stream:
                await stream.send_all(data)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(echo, listeners)


async def through(cfg: LinkConfig, work) -> tuple[object, FlakyLink]:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(echo_server)
        link = FlakyLink(("127.0.0.1", port), cfg)
        await nursery.start(link.serve)
        result = await work(link.port)
        nursery.cancel_scope.cancel()
    return result, link


async def round_trips(port: int) -> list[float]:
    out = []
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        for i in range(PINGS):
            started = time.perf_counter()
            await stream.send_all(b"ping %d\n" % i)
            got = b""
            while len(got) < len(b"ping %d\n" % i):
                got += await stream.receive_some(64)
            out.append(time.perf_counter() - started)
    return out


@pytest.mark.parametrize("delay_ms", [10.0, 25.0, 50.0])
def test_each_round_trip_gains_twice_the_delay_succeeds(delay_ms):
    rtts, _ = trio.run(through, LinkConfig(delay_ms=delay_ms), round_trips)
    assert min(rtts) >= 2 * delay_ms / 1000, rtts
    assert sorted(rtts)[len(rtts) // 2] < 2 * delay_ms / 1000 + 0.05, rtts  # and not much more (median)


def test_bytes_stay_in_order_under_jitter_succeeds():
    payload = [b"%05d," % i for i in range(400)]

    async def stream_them(port: int) -> bytes:
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            got = b""
            for chunk in payload:  # many small writes, each its own jittered delay
                await stream.send_all(chunk)
            while len(got) < sum(map(len, payload)):
                got += await stream.receive_some(4096)
        return got

    got, link = trio.run(through, LinkConfig(delay_ms=5.0, jitter_ms=5.0, seed=3), stream_them)
    assert got == b"".join(payload)
    assert max(link.stats.delays_ms) - min(link.stats.delays_ms) > 5.0  # the jitter was real


def test_the_link_is_cut_once_after_the_bytes_it_is_told_succeeds():
    async def two_connections(port: int) -> tuple[bytes, bytes]:
        async def one() -> bytes:
            got = b""
            async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
                await stream.send_all(b"x" * 100)
                with trio.fail_after(5):
                    while len(got) < 100:
                        data = await stream.receive_some(64)
                        if not data:
                            break  # the cut: the stream ends early
                        got += data
            return got

        return await one(), await one()

    (first, second), link = trio.run(through, LinkConfig(cut_after_bytes=40), two_connections)
    assert first == b"x" * 40 and second == b"x" * 100  # cut once, mid-answer; the next connection passes
    assert link.stats.cuts == 1


@pytest.mark.parametrize("bad", [{"delay_ms": -1}, {"jitter_ms": 1e9}, {"cut_after_bytes": 0}, {"delay_ms": True}])
def test_a_senseless_link_is_refused_succeeds(bad):
    with pytest.raises(LinkError):
        LinkConfig(**bad)
