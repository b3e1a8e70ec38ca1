"""Logs that tell the truth (issue 14, item 4): a session the target closes at the end of its job is
logged as its end, not as a failure; a target does not dial drafters that left; every line a node
writes to stderr starts with its time and level, one event per line.

One target process and one honest drafter process serve the whole module (the drafter is killed by
the last test that uses them); the rest runs on real libp2p hosts in this process.
"""

from __future__ import annotations

import logging
import re
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.discovery.rendezvous import RendezvousClient
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.utils.varint import encode_uvarint

from market.ledger import Ledger
from market.policy import Policy
from market.registry import Registry
from node.lab.procs import STARTUP_TIMEOUT_S, ProcessGroup
from node.runtime.logs import LOG_FORMAT, OneLineFormatter
from node.target.market import MarketDrafting
from p2p.discovery import RendezvousPoint, announce, drafter_namespace
from p2p.framing import FrameStream, StreamEnded, StreamFailed
from p2p.host import load_identity, make_host, parse_listen, parse_peer_addr, peer_addrs
from p2p.messages import DRAFT_PROTOCOL_ID, TO_DRAFTER, TO_TARGET, Open, encode
from tests.netutil import InProcessDrafter, complete, start_drafter, start_target, wait_for_drafters

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")
LOOPBACK = "/ip4/127.0.0.1/tcp/0"
NS = drafter_namespace("cd" * 32)
LOG_WAIT_S = 15.0
QUIET_S = 3.0  # after the job that would have dialed a dead drafter: dials retry within ~1 s
V = 64


def until_in_log(node, text: str, timeout_s: float = LOG_WAIT_S) -> str:
    deadline = time.monotonic() + timeout_s
    while text not in node.log():
        assert time.monotonic() < deadline, f"{text!r} not in the log:\n{node.log()[-3000:]}"
        time.sleep(0.1)
    return node.log()


def peer_id_of(node) -> str:
    return node.lines["multiaddr"][0].rsplit("/", 1)[-1]


def port_of(node) -> int:
    return int(node.lines["multiaddr"][0].split("/tcp/", 1)[1].split("/", 1)[0])


def job_of(answer: dict) -> str:
    return answer["specmarket"].get("job") or answer["id"].removeprefix("cmpl-")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def pair_of_nodes(tmp_path_factory):
    """(target, honest drafter), separate processes on loopback, the drafter in the market. The
    drafter starts first, as a new user may start it: it retries registering until the target is
    up, so py-libp2p has logged its failed dials (at ERROR) on the drafter's stderr."""
    tmp = tmp_path_factory.mktemp("logs")
    port, target_id = free_port(), ID.from_pubkey(load_identity(tmp / "target").public_key)
    bootstrap = f"/ip4/127.0.0.1/tcp/{port}/p2p/{target_id}"
    log = tmp / "drafter.log"
    with ThreadPoolExecutor(max_workers=1) as pool, ProcessGroup() as group:  # on error the drafter stops first
        starting = pool.submit(start_drafter, tmp, bootstrap, "honest", "drafter", group=group)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not log.exists() or "registering with" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline and not starting.done(), "the drafter never tried to register"
            time.sleep(0.1)
        listen = ("--listen", f"/ip4/127.0.0.1/tcp/{port}")
        target = start_target(tmp, *listen, "--draft-deadline-ms", "1000", group=group)
        drafter = starting.result()
        wait_for_drafters(target.lines["http"][0], 1)
        yield target, drafter


def test_a_session_the_target_closes_is_logged_as_its_end(pair_of_nodes):
    """It read `session with <target> ended: stream from <target> failed: StreamEOF:`."""
    target, drafter = pair_of_nodes
    answer = complete(target.lines["http"][0], "def parse(self, text):\n", seed=1, max_tokens=16)
    ended = f"job {job_of(answer)}: session with {peer_id_of(target)} ended ("
    log = until_in_log(drafter, ended)
    line = next(line for line in log.splitlines() if ended in line)
    assert re.search(r" INFO .* ended \((\d+) rounds?, (\d+) draft tokens sent\)$", line), line
    rounds, tokens = map(int, re.findall(r"\d+", line.rsplit("(", 1)[1]))
    assert rounds >= 1 and tokens >= 1, line
    assert not [line for line in log.splitlines() if "session with" in line and "failed" in line], log[-3000:]
    assert "StreamEOF" not in log, log[-3000:]


def test_every_line_either_node_writes_is_timestamped(pair_of_nodes):
    """py-libp2p's records bypassed the format: logging's last resort wrote `Failed to open TCP
    stream: all attempts to connect to 127.0.0.1:PORT failed`, without a time or a level."""
    target, drafter = pair_of_nodes
    complete(target.lines["http"][0], "import os\n\n", seed=2, max_tokens=8)
    for node in (target, drafter):
        lines = [line for line in node.log().splitlines() if line.strip()]
        bad = [line for line in lines if not STAMPED.match(line)]
        assert lines and not bad, f"{node.log_path.name}: {bad[:5]}"
    assert " ERROR libp2p." in drafter.log(), drafter.log()[-3000:]  # the failed dials, formatted


def test_the_target_does_not_dial_a_drafter_that_is_gone(pair_of_nodes):
    """The drafter dies (SIGKILL: no unregistration, its registration lives on for minutes). The
    target used to dial it for every job, and py-libp2p's auto-connector dialed it again and again
    (its addresses stay two hours in the peerstore), each dial four TCP attempts logged at ERROR."""
    target, drafter = pair_of_nodes
    gone, port = peer_id_of(drafter), port_of(drafter)
    start = len(target.log())
    drafter.kill()
    time.sleep(0.5)  # the target sees the connection close
    for seed in range(2):
        answer = complete(target.lines["http"][0], "class Cache:\n", seed=seed, max_tokens=8)
        assert len(answer["specmarket"]["tokens"]) == 8
    time.sleep(QUIET_S)
    after = target.log()[start:]
    dials = [line for line in after.splitlines() if f"127.0.0.1:{port} " in line or f"draft stream to {gone}" in line]
    assert not dials, dials
    assert f"drafter {gone} is not connected; it sits the job out" in after, after[-3000:]


def test_a_session_ends_as_a_failure_when_its_connection_is_lost(portal, point, pair, tmp_path, caplog):
    """The stream closing with its connection (the target died) is a failure; the stream closing
    alone (the job is done) is the end. Both used to read `ended: ... failed: StreamEOF:` at INFO."""
    caplog.set_level(logging.INFO, logger="node.drafter.peer")
    drafter = InProcessDrafter(portal, tmp_path, peer_addrs(point)[0], "honest")
    info = parse_peer_addr(drafter.addrs[0])

    async def session(job: str, hang_up: bool) -> None:
        await point.connect(info)
        stream = await point.new_stream(info.peer_id, [DRAFT_PROTOCOL_ID])
        fs = FrameStream(stream, vocab_size=pair.target.vocab_size, allowed=TO_TARGET)
        await fs.send(Open(job, (0, 5, 9), 1.0, 0, 1.0, 3, 4, 0), 5.0)
        await fs.receive(30.0)  # its answer
        if hang_up:
            await point.disconnect(info.peer_id)
        else:
            await fs.close()

    try:
        portal.run(session, "closed", False)
        portal.run(session, "lost", True)
        deadline = time.monotonic() + LOG_WAIT_S
        while drafter.node.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        drafter.stop()
    lines = {r.getMessage().split(":", 1)[0]: r for r in caplog.records if "session with" in r.getMessage()}
    assert lines["job closed"].levelno == logging.INFO and "ended (1 round, " in lines["job closed"].getMessage()
    assert (
        lines["job lost"].levelno == logging.WARNING
        and "failed: the connection was lost" in lines["job lost"].getMessage()
    )


def test_a_host_never_dials_on_its_own(portal):
    """py-libp2p's auto-connector aims at the midpoint of the watermarks (112 connections, whatever
    low_watermark says) and dials every peer in the peerstore: a peer that left was dialed again 60 s
    after its disconnect, then every 30 s. A listening socket stands in for the departed peer."""
    listener = socket.create_server(("127.0.0.1", 0))
    absent = ID.from_pubkey(create_new_key_pair().public_key)
    addr = parse_listen(f"/ip4/127.0.0.1/tcp/{listener.getsockname()[1]}")

    async def tick() -> None:
        host = make_host(create_new_key_pair())
        async with host.run(listen_addrs=[parse_listen(LOOPBACK)]):
            host.get_peerstore().add_addrs(absent, [addr], 600)
            with trio.move_on_after(2.0):
                await host.get_network().auto_connector.maybe_connect()  # the 30 s tick, or a disconnect

    with listener:
        portal.run(tick)
        listener.settimeout(0.5)
        with pytest.raises(TimeoutError):
            listener.accept()[0].close()


def test_a_drafter_that_leaves_leaves_no_address_behind(portal, tmp_path):
    """Its addresses (from its registration, and identify's for two hours) were kept; they are the
    ones a dial would use."""
    with Ledger(tmp_path / "ledger.sqlite") as ledger:

        async def leave() -> tuple[bool, bool]:
            host = make_host(create_new_key_pair())
            async with host.run(listen_addrs=[parse_listen(LOOPBACK)]):
                registry = Registry()
                drafting = MarketDrafting(
                    host, registry, Policy(), ledger, deadline_s=1.0, max_drafters=1, vocab_size=V
                )
                peer = ID.from_pubkey(create_new_key_pair().public_key)
                host.get_peerstore().add_addrs(peer, [parse_listen("/ip4/127.0.0.1/tcp/9")], 7200)  # as identify does
                registry.upsert(str(peer), ["/ip4/127.0.0.1/tcp/9"])
                drafting.on_gone(str(peer))
                return peer in host.get_peerstore().peers_with_addrs(), str(peer) in registry

        kept_addrs, listed = portal.run(leave)
    assert not kept_addrs and not listed


def test_the_point_hangs_up_on_a_peer_whose_registration_ended(portal):
    """A peer that unregistered (or whose registration expired) but stays connected is disconnected
    once it has had time to hang up by itself."""

    async def scene() -> tuple[bool, bool]:
        target, peer = make_host(create_new_key_pair()), make_host(create_new_key_pair())
        listen = [parse_listen(LOOPBACK)]
        async with target.run(listen_addrs=listen), peer.run(listen_addrs=listen), trio.open_nursery() as nursery:
            point = RendezvousPoint(target, NS, hang_up_after_s=0.3)
            gone: list[str] = []
            nursery.start_soon(point.watch, lambda reg: None, gone.append)
            bootstrap = PeerInfo(target.get_id(), target.get_addrs())
            async with trio.open_nursery() as inner:
                await inner.start(announce, peer, bootstrap, NS)
                await trio.sleep(0.3)  # the watch sees it registered
                inner.cancel_scope.cancel()
            await RendezvousClient(peer, target.get_id()).unregister(NS)  # and stays connected
            with trio.fail_after(5):
                while not gone:
                    await trio.sleep(0.05)
            connected_after_gone = bool(target.get_network().get_connections(peer.get_id()))
            with trio.move_on_after(5):
                while target.get_network().get_connections(peer.get_id()):
                    await trio.sleep(0.05)
            still = bool(target.get_network().get_connections(peer.get_id()))
            nursery.cancel_scope.cancel()
            return connected_after_gone, still

    connected_after_gone, still = portal.run(scene)
    assert connected_after_gone and not still


def test_a_close_between_frames_is_an_end_and_a_cut_frame_a_failure(portal):
    async def scene() -> tuple[BaseException, BaseException]:
        server, client = make_host(create_new_key_pair()), make_host(create_new_key_pair())
        seen: list[BaseException] = []
        done = trio.Event()

        async def handler(stream) -> None:
            fs = FrameStream(stream, vocab_size=V, allowed=TO_DRAFTER)
            try:
                while True:
                    await fs.receive(5.0)
            except StreamFailed as exc:
                seen.append(exc)
                if len(seen) == 2:
                    done.set()

        listen = [parse_listen(LOOPBACK)]
        async with server.run(listen_addrs=listen), client.run(listen_addrs=listen):
            server.set_stream_handler(DRAFT_PROTOCOL_ID, handler)
            await client.connect(PeerInfo(server.get_id(), server.get_addrs()))
            frame = encode(Open("j", (0, 5, 9), 1.0, 0, 1.0, 3, 4, 0))
            for body in (frame, frame[:-3]):  # a whole frame, then a frame cut short
                stream = await client.new_stream(server.get_id(), [DRAFT_PROTOCOL_ID])
                await stream.write(encode_uvarint(len(frame)) + body)
                await stream.close()
                await trio.sleep(0.2)
            with trio.fail_after(10):
                await done.wait()
        return seen[0], seen[1]

    clean, cut = portal.run(scene)
    assert isinstance(clean, StreamEnded), clean
    assert not isinstance(cut, StreamEnded) and isinstance(cut, StreamFailed), cut


def test_a_traceback_is_folded_into_its_records_line():
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("libp2p.x", logging.ERROR, __file__, 1, "it failed", None, sys.exc_info())
    text = OneLineFormatter(LOG_FORMAT).format(record)
    assert "\n" not in text and STAMPED.match(text) and "Traceback" in text and "second line" in text


def test_ask_over_libp2p_writes_timestamped_lines_and_its_one_line_error():
    """`ask` never sets up a node's logging, and py-libp2p's logger stops propagating once imported:
    its ERROR lines used to reach stderr bare, without time or level."""
    import subprocess

    from node.chain.anvil import free_port
    from tests.netutil import SPECMARKET

    nobody = ID.from_pubkey(create_new_key_pair().public_key)
    target = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{nobody}"  # nothing listens there
    args = ["ask", "hi", "--target", target, "--pair", "tiny", "--max-new-tokens", "2"]
    done = subprocess.run([*SPECMARKET, *args], capture_output=True, text=True, timeout=STARTUP_TIMEOUT_S)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and lines[-1].startswith("specmarket: error"), done.stderr[-2000:]
    assert any(" libp2p." in line for line in lines[:-1]), lines  # py-libp2p did log: not vacuous
    assert all(STAMPED.match(line) for line in lines[:-1]), lines
