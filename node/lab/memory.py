"""The demo's peak memory, sampled while it runs (Linux ``/proc``).

Two views, both in the demo's JSON:

- ``tree_pss``: the summed proportional set size (PSS) of this process and every descendant, the
  peak over the run. PSS charges a page shared by n processes 1/n to each, so the memory-mapped
  weights that every target, referee and drafter maps are counted once in the sum: it is what the
  demo's processes hold, shared pages and all.
- ``system_used``: MemTotal − MemAvailable of the whole machine, its peak over the run minus its
  value at the start (idle): what the run took from the machine, page cache it could not give
  back included.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

SAMPLE_EVERY_S = 0.5  # MemAvailable: one small read
# PSS makes the kernel walk every page of every process's mappings: ~13 ms for a process that maps
# the 1.5B pair, ~0.1 s for the demo's dozen processes. Every 0.5 s that took a fifth of a core from
# the processes being timed; the mapped weights' share is steady once loaded, so every 5 s suffices.
PSS_EVERY_SAMPLES = 10
GIB = 1 << 30


def _meminfo_used() -> int:
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = int(value.split()[0]) * 1024
    return fields["MemTotal"] - fields["MemAvailable"]


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def _pss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss(root: int) -> int:
    """Summed PSS of ``root`` and its descendants, bytes."""
    tree, todo, total = _children(), [root], 0
    while todo:
        pid = todo.pop()
        total += _pss(pid)
        todo.extend(tree.get(pid, ()))
    return total


class MemoryPeak:
    """A context manager sampling both views every SAMPLE_EVERY_S in a daemon thread."""

    def __init__(self) -> None:
        self.idle_used = self.peak_used = _meminfo_used()
        self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="memory-peak", daemon=True)

    def _sample(self) -> None:
        samples = 0
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.peak_used = max(self.peak_used, _meminfo_used())
            if samples % PSS_EVERY_SAMPLES == 0:
                self.peak_pss = max(self.peak_pss, tree_pss(os.getpid()))
            samples += 1

    def __enter__(self) -> MemoryPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def report(self) -> dict:
        return {
            "tree_pss_peak_gib": round(self.peak_pss / GIB, 2),
            "system_used_peak_above_idle_gib": round((self.peak_used - self.idle_used) / GIB, 2),
            "system_used_idle_gib": round(self.idle_used / GIB, 2),
            "sampled_every_s": SAMPLE_EVERY_S,
            "pss_sampled_every_s": SAMPLE_EVERY_S * PSS_EVERY_SAMPLES,
        }
