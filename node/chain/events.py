"""Contract events read reorg-safe. A chain may replace its newest blocks (a reorganisation): an
event seen in a replaced block may be gone, or another event may now stand at a height a scan has
already passed. So every scan reads the blocks since the last one and the REORG_DEPTH blocks before
them again, and the events of that window replace what was seen there: an event is kept only
while its block (by hash) is still on the chain. A reorganisation deeper than REORG_DEPTH blocks
is not caught (Ethereum's finality, two epochs, is far deeper; a local anvil has none).
"""

from __future__ import annotations

from typing import Any

from node.chain.client import BondClient

REORG_DEPTH = 12  # blocks every scan reads again


def rescan_from(next_block: int, latest: int, first_block: int = 0, depth: int = REORG_DEPTH) -> int:
    """Where a scan up to ``latest`` starts when the last one stopped before ``next_block``: the
    ``depth`` blocks before it again (``latest`` may have moved back), never before ``first_block``."""
    return max(first_block, min(next_block, latest + 1) - depth)


class EventWindow:
    """The ``name`` events matching ``filters`` from block ``first_block`` on, kept up to date by
    ``scan``: the events before the re-read window are settled, those inside it are read afresh."""

    def __init__(
        self, client: BondClient, name: str, first_block: int = 0, depth: int = REORG_DEPTH, **filters: Any
    ) -> None:
        self.client, self.name, self.filters = client, name, filters
        self.first_block, self.depth = first_block, depth
        self.next_block = first_block  # the first block the last scan did not reach
        self.events: list[dict[str, Any]] = []  # oldest first

    def scan(self, latest: int) -> list[dict[str, Any]]:
        """Read up to block ``latest`` (which a reorganisation may have moved back); the events now."""
        start = rescan_from(self.next_block, latest, self.first_block, self.depth)
        self.events = [e for e in self.events if e["block"] < start]  # the window's (and any past latest) go
        if start <= latest:
            self.events += self.client.events(self.name, start, latest, **self.filters)
        self.next_block = latest + 1
        return self.events
