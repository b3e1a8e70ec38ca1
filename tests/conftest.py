from __future__ import annotations

import pytest
import torch

from node.models import load_pair

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def pair():
    """The shipped target/draft pair (loaded once per test session)."""
    return load_pair()
