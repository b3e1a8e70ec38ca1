"""Option precedence for every command: command line > config file (TOML) > built-in defaults."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from verifier.errors import SpecmarketError


class ConfigError(SpecmarketError):
    """An unreadable config file or an unknown key in it."""


def load_section(path: Path | None, section: str) -> dict[str, Any]:
    """The ``[section]`` table of a TOML file (keys may use '-' or '_'); {} without a file."""
    if path is None:
        return {}
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] in {path} must be a table")
    return {key.replace("-", "_"): value for key, value in table.items()}


def resolve(args: argparse.Namespace, section: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """Merge CLI values (None = not given), the config file's section and ``defaults``."""
    from_file = load_section(getattr(args, "config", None), section)
    unknown = set(from_file) - set(defaults)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{section}]: {', '.join(sorted(unknown))}")
    merged = {}
    for key, default in defaults.items():
        cli = getattr(args, key, None)
        merged[key] = cli if cli is not None else from_file.get(key, default)
    return merged
