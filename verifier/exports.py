"""Lazy public APIs (PEP 562) for the packages' ``__init__`` files.

A package lists its public names and the module each comes from; a name is imported on first use.
So ``from node.target import TargetConfig`` (what the CLI needs to build its parser) does not load
libp2p, torch and web3 along with the rest of the package.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]) -> tuple[Callable[[str], Any], list[str]]:
    """The module-level ``__getattr__`` and ``__all__`` of ``package``; ``exports`` maps each
    module to the public names it defines."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__, sorted(where)
