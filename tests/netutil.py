"""Helpers for tests that run real target and drafter processes on loopback (they live in
node/lab/procs.py and node/client/http.py, shared with the networked demo and the benchmark)."""

from __future__ import annotations

from node.client.http import complete, http_json  # noqa: F401  (re-exported)
from node.lab.procs import (  # noqa: F401  (re-exported)
    SPECMARKET,
    NodeProcess,
    start_drafter,
    start_target,
    wait_for_drafters,
)
