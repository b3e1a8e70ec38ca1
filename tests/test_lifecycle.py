"""Lifecycle: signals are honoured at every stage, a node that cannot serve never bonds, and peers
survive restarts (a target keeps its multiaddr; a drafter finds a target that moved)."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
from eth_account import Account
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from netutil import SPECMARKET, start_drafter, start_target, wait_for_drafters

from node.chain.anvil import free_port
from node.chain.keys import write_key
from p2p.host import peer_addrs, running_host

pytestmark = pytest.mark.slow(seconds=40)  # scheduled first (tests/conftest.py)

STARTUP_TIMEOUT_S = 120.0  # importing torch and loading the tiny model on a busy 2-core machine
SIGNAL_EXIT_S = 10.0  # a node told to stop is gone this soon, whatever it was doing
RUN_TIMEOUT_S = 180
FOLLOW_TIMEOUT_S = 90.0  # a drafter's backoff while its target is away, then the look-up


def wait_for_text(path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.1)


def tcp_port(multiaddr: str) -> int:
    return int(multiaddr.split("/tcp/")[1].split("/")[0])


@contextmanager
def occupied(port: int) -> Iterator[None]:
    """Someone else listens on ``port`` (closing each connection at once, so dials fail fast)."""
    server = socket.create_server(("127.0.0.1", port))  # SO_REUSEADDR: the old node's TIME_WAITs allow it

    def refuse() -> None:
        with contextlib.suppress(OSError):
            while True:
                server.accept()[0].close()

    threading.Thread(target=refuse, daemon=True).start()
    try:
        yield
    finally:
        server.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_drafter_whose_target_is_unreachable_stops_on_a_signal(tmp_path, sig):
    """It used to ignore both until its first registration succeeded, i.e. forever."""
    nobody = ID.from_pubkey(create_new_key_pair().public_key)
    bootstrap = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{nobody}"  # nothing listens there
    log = tmp_path / "drafter.log"
    args = ["drafter", "--pair", "tiny", "--data-dir", str(tmp_path / "d"), "--bootstrap", bootstrap]
    with log.open("w") as err:
        proc = subprocess.Popen([*SPECMARKET, *args], stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_for_text(log, "registering with", STARTUP_TIMEOUT_S)  # in its retry loop
        proc.send_signal(sig)
        status = proc.wait(SIGNAL_EXIT_S)
    finally:
        proc.kill()
        proc.wait()
    assert status in (0, 128 + sig), log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def test_a_target_bonding_on_a_chain_that_never_answers_stops_on_a_signal(tmp_path):
    """Bonding runs after the listeners are bound, in a worker thread; a signal still stops it."""
    rpc = socket.create_server(("127.0.0.1", 0))  # accepts, never answers: web3 waits its 30 s timeout
    accepted = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            held.append(rpc.accept()[0])
            accepted.set()

    threading.Thread(target=accept, daemon=True).start()
    log = tmp_path / "target.log"
    args = ["target", "--pair", "tiny", "--data-dir", str(tmp_path / "t"), "--http", "127.0.0.1:0"]
    args += ["--chain", f"http://127.0.0.1:{rpc.getsockname()[1]}", "--deployments", str(tmp_path / "dep")]
    with log.open("w") as err:
        proc = subprocess.Popen([*SPECMARKET, *args], stdout=subprocess.DEVNULL, stderr=err)
    try:
        assert accepted.wait(STARTUP_TIMEOUT_S), "the target never called its chain"
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(SIGNAL_EXIT_S)
    finally:
        proc.kill()
        proc.wait()
        rpc.close()
        for conn in held:
            conn.close()
    assert status == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("taken", ["http", "libp2p"])
def test_a_bonded_target_whose_port_is_taken_fails_before_it_bonds(chain, tmp_path, taken):
    """It used to register and bond 1 ETH, then die on 'Address already in use' with a traceback,
    leaving an active operator with no node behind it."""
    key = bytes(Account.create().key)
    key_file = write_key(tmp_path / "operator.key", key)
    blocker = socket.create_server(("127.0.0.1", 0))
    port = blocker.getsockname()[1]
    where = ["--http", f"127.0.0.1:{port}"]
    if taken == "libp2p":
        where = ["--http", "127.0.0.1:0", "--listen", f"/ip4/127.0.0.1/tcp/{port}"]
    bonded = ["--chain", chain.rpc, "--deployments", str(chain.deployments), "--operator-key", str(key_file)]
    args = ["target", "--pair", "tiny", "--data-dir", str(tmp_path / "t"), *bonded, *where]
    try:
        done = subprocess.run([*SPECMARKET, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    finally:
        blocker.close()
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("specmarket: error")]
    assert len(errors) == 1 and str(port) in errors[0] and "in use" in errors[0], done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == errors[0]
    assert not chain.client.operator_info(Account.from_key(key).address).registered  # nothing happened on chain


def test_a_host_keeps_its_port_across_restarts_and_moves_only_when_it_is_taken(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="p2p.host")

    async def addrs() -> list[str]:
        async with running_host(tmp_path, "/ip4/127.0.0.1/tcp/0") as host:
            return peer_addrs(host)

    first = trio.run(addrs)
    assert trio.run(addrs) == first  # the same multiaddr: peers that knew it still reach it
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", tcp_port(first[0])))  # someone else has it now
        moved = trio.run(addrs)
    assert tcp_port(moved[0]) != tcp_port(first[0]) and moved[0].endswith(first[0].rsplit("/", 1)[-1])
    assert "taken" in caplog.text
    assert trio.run(addrs) == moved  # the new port is the one kept from now on


def test_a_drafter_finds_its_target_after_it_moved_to_another_port(tmp_path):
    http_port = free_port()
    http = f"http://127.0.0.1:{http_port}"
    fixed_http = ["--http", f"127.0.0.1:{http_port}", "--max-drafters", "1"]
    first = start_target(tmp_path, *fixed_http, name="target")
    old = first.lines["multiaddr"][0]
    try:
        drafter = start_drafter(tmp_path, old, "honest", "drafter", "--target-http", http)
    finally:
        first.stop()
    try:
        with occupied(tcp_port(old)):  # the old port is gone: the target must move
            second = start_target(tmp_path, *fixed_http, name="target")  # same data dir, same peer id
            try:
                new = second.lines["multiaddr"][0]
                assert tcp_port(new) != tcp_port(old) and new.endswith(old.rsplit("/", 1)[-1])
                wait_for_drafters(http, 1, FOLLOW_TIMEOUT_S)
            finally:
                second.stop()
    finally:
        drafter.stop()
    assert "moved" in drafter.log(), drafter.log()[-3000:]
