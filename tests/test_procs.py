"""node.lab.procs.spawn: the start-up wait has a deadline, and a child that dies says how."""

from __future__ import annotations

import sys
import time

import pytest

from node.lab import procs

SILENT_CHILD = "import time; print('booting: 1', flush=True); time.sleep(60)"
DYING_CHILD = "import sys; print('booting: 1', flush=True); sys.stderr.write('bad config\\n'); sys.exit(3)"
STARTUP_LIMIT_S = 1.0


def _python(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    """Stand a tiny Python program in for ``python -m node`` (spawn's arguments follow it)."""
    monkeypatch.setattr(procs, "SPECMARKET", [sys.executable, "-c", code])


def test_spawn_child_that_never_says_ready_times_out_and_is_killed(monkeypatch, tmp_path):
    _python(monkeypatch, SILENT_CHILD)
    group = procs.ProcessGroup()
    started = time.monotonic()
    with pytest.raises(procs.ProcessFailed, match="did not start within 1 s"):
        procs.spawn(["target", "--pair", "tiny"], tmp_path / "t.log", ("http",), timeout_s=STARTUP_LIMIT_S, group=group)
    assert time.monotonic() - started < STARTUP_LIMIT_S + 5
    (node,) = group.children
    assert node.proc.poll() is not None  # killed, not left behind


def test_spawn_child_that_exits_reports_its_code_and_log(monkeypatch, tmp_path):
    _python(monkeypatch, DYING_CHILD)
    with pytest.raises(procs.ProcessFailed, match=r"exited \(3\) before starting:\nbad config"):
        procs.spawn(["target", "--pair", "tiny"], tmp_path / "t.log", ("http",), timeout_s=30)
