"""Where a role keeps its state: its data directory, never inside the repository."""

from __future__ import annotations

import os
from pathlib import Path


def default_data_dir(role: str) -> Path:
    """Where a role keeps its state unless told otherwise: $XDG_DATA_HOME/specmarket/ROLE
    (default ~/.local/share/specmarket/ROLE), never inside the repository."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "specmarket" / role
