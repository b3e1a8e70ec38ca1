from __future__ import annotations

import os
import signal

import pytest
import torch

from node.lab.trio_thread import TrioThread
from node.model.loading import load_pair

# two cores: both for torch in one pytest process, one each under `pytest -n 2` (pytest-xdist workers)
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)

# A suite started in the background by a script inherits SIGINT ignored (POSIX: a non-interactive
# shell's background jobs ignore it), and so would every process it starts: Python then installs no
# KeyboardInterrupt, and the tests of Ctrl-C (`ask`, the demo, the nodes) would only see it ignored.
# They stand for a Ctrl-C at a terminal, where SIGINT has its default: a handler here is reset to
# the default in every child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _expected_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("slow")
    return 0.0 if marker is None else float(marker.kwargs.get("seconds", 60))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: the modules marked ``slow(seconds=...)`` lead the collection, longest first,
    the rest keep their order. `make test` runs pytest-xdist with --no-loadscope-reorder, which hands
    whole modules to the workers in this order, so no long module starts last while the other worker
    idles (longest-processing-time-first scheduling, Graham 1969: within 4/3 of the best makespan)."""
    items.sort(key=lambda item: -_expected_seconds(item))  # stable: each module keeps its own order


@pytest.fixture(scope="session")
def pair():
    """The shipped target/draft pair (loaded once per test session)."""
    return load_pair()


@pytest.fixture(scope="module")
def portal():
    """A trio loop in a background thread for in-process libp2p hosts and nodes."""
    loop = TrioThread()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def attacker(portal):
    """One Noise host in the portal's loop that sends hostile frames."""
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair

    from p2p.host import make_host, parse_listen

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        host = make_host(create_new_key_pair())
        async with host.run(listen_addrs=[parse_listen("/ip4/127.0.0.1/tcp/0")]):
            task_status.started(host)
            await trio.sleep_forever()

    host, stop = portal.start(run)
    yield host
    stop()


@pytest.fixture(scope="module")
def hosts(portal):
    """(target-side host, drafter-side host), connected over loopback with Noise."""
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair

    from p2p.host import make_host, parse_listen, parse_peer_addr, peer_addrs

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        target, drafter = make_host(create_new_key_pair()), make_host(create_new_key_pair())
        listen = [parse_listen("/ip4/127.0.0.1/tcp/0")]
        async with target.run(listen_addrs=listen), drafter.run(listen_addrs=listen):
            await target.connect(parse_peer_addr(peer_addrs(drafter)[0]))
            task_status.started((target, drafter))
            await trio.sleep_forever()

    value, stop = portal.start(run)
    yield value
    stop()


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    """A real anvil (from npm) on a free loopback port with SpecmarketBond deployed (defaults as
    Deploy.s.sol: 3 referees = anvil accounts 1-3, threshold 2); stopped at the end of the session."""
    from chainutil import deployed_chain

    with deployed_chain(tmp_path_factory.mktemp("deployments")) as chain:
        yield chain


@pytest.fixture(scope="session")
def real_pair():
    """The real pair: SmolLM2-135M-Instruct (converted by `make setup`) and the draft shipped for it,
    on the kernel a target node serves with by default (node.model.kernels)."""
    from node.model.kernels import DEFAULT_KERNEL
    from node.model.pairs import get_pair

    named = get_pair("smollm2")
    return load_pair(named.target_dir(), named.draft_dir(), DEFAULT_KERNEL)


@pytest.fixture(scope="module")
def point(portal, pair):
    """A bare rendezvous point (a host in this process): the target that in-process drafters register
    with (``InProcessDrafter(portal, tmp, peer_addrs(point)[0], ...)``). A drafter serves sessions only
    from its own target, so tests that play a hostile target send their frames from this host."""
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair

    from p2p.discovery import RendezvousPoint, drafter_namespace
    from p2p.host import make_host, parse_listen

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        host = make_host(create_new_key_pair())
        async with host.run(listen_addrs=[parse_listen("/ip4/127.0.0.1/tcp/0")]):
            RendezvousPoint(host, drafter_namespace(pair.fingerprint))
            task_status.started(host)
            await trio.sleep_forever()

    host, stop = portal.start(run)
    yield host
    stop()
