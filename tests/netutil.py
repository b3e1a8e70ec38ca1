"""Helpers for tests that run real target and drafter processes on loopback (they live in
node/procs.py, shared with the networked demo and the benchmark)."""

from __future__ import annotations

from node.lab.procs import (  # noqa: F401  (re-exported)
    SPECMARKET,
    NodeProcess,
    complete,
    http_json,
    start_drafter,
    start_target,
    wait_for_drafters,
)
