"""Helpers for tests that run real target and drafter processes on loopback (they live in
node/lab/procs.py and node/client/http.py, shared with the networked demo and the benchmark), and a
drafter peer running in the test's own process."""

from __future__ import annotations

from functools import partial
from typing import Any

import trio

from node.client.http import complete, http_json  # noqa: F401  (re-exported)
from node.drafter.config import DrafterConfig
from node.drafter.peer import DrafterNode
from node.lab import procs
from node.lab.procs import SPECMARKET, NodeProcess, wait_for_drafters  # noqa: F401  (re-exported)
from node.lab.trio_thread import TrioThread

TEST_PAIR = "tiny"  # network tests exercise the protocol, not the model: the fast pair
start_target = partial(procs.start_target, pair=TEST_PAIR)
start_drafter = partial(procs.start_drafter, pair=TEST_PAIR)


class InProcessDrafter:
    """A real DrafterNode in ``portal``'s trio loop, registered with the target at ``bootstrap``."""

    def __init__(self, portal: TrioThread, tmp, bootstrap: str, strategy: str, name: str = "", **cfg: Any) -> None:
        data_dir = tmp / (name or strategy)
        self.node = DrafterNode(
            DrafterConfig(bootstrap=bootstrap, strategy=strategy, data_dir=data_dir, pair=TEST_PAIR, **cfg)
        )
        self.portal = portal
        self.addrs, self._stop = portal.start(self.node.run)
        self.peer_id = self.addrs[0].rsplit("/", 1)[-1]

    def stop(self) -> None:
        """Graceful, as on Ctrl-C: the drafter withdraws its registration, then stops."""
        trio.from_thread.run_sync(self.node.request_stop, trio_token=self.portal.token)
        self._stop(5.0)
