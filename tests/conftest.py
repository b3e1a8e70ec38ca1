from __future__ import annotations

import pytest
import torch

from node.models import load_pair
from node.trio_thread import TrioThread

torch.set_num_threads(2)


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


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    """A real anvil (from npm) on a free loopback port with SpecmarketBond deployed (defaults as
    Deploy.s.sol: 3 referees = anvil accounts 1-3, threshold 2); stopped at the end of the session."""
    from chainutil import Chain, free_port

    from node.chain.anvil import AnvilProcess
    from node.chain.client import BondClient, connect, deploy
    from node.chain.deployment import DEFAULT_THRESHOLD, DEV_DEPLOYER, DEV_REFEREES, BondConfig, dev_address, dev_key

    with AnvilProcess(free_port()) as anvil:
        w3 = connect(anvil.url)
        referees = [dev_address(i) for i in DEV_REFEREES]
        deployment, tx = deploy(w3, dev_key(DEV_DEPLOYER), BondConfig(), referees, DEFAULT_THRESHOLD)
        deployments = tmp_path_factory.mktemp("deployments")
        deployment.save(deployments)
        yield Chain(anvil.url, deployments, deployment, BondClient(w3, deployment.address), tx.gas_used)
