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
