"""JSON (and TOML) from outside the process, with its nesting depth bounded before it is parsed.

Importing web3 imports ``py_ecc``, which raises the interpreter's recursion limit to 100,000. The
C JSON decoder recurses once per ``[`` or ``{``, so a 200 KB body of nested brackets then
overflows the C stack (a segmentation fault, exit 139, nothing logged) before any
``RecursionError`` can fire. So the depth is bounded here, whatever the recursion limit is: the
brackets outside strings are counted with two regular expressions and a cumulative sum, in C
speed, and a document deeper than ``max_depth`` is refused before the parser sees it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from verifier.errors import SpecmarketError

MAX_JSON_DEPTH = 64  # an OpenAI-style request or a receipt nests 3-6 deep; JSON schemas in tools ~20
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)  # a JSON string, as the decoder lexes it
_NOT_BRACKET = re.compile(rb"[^\[\]{}]")
_OPEN = np.frombuffer(b"[{", dtype=np.uint8)


class TooDeep(SpecmarketError, ValueError):
    """A document nested deeper than its reader allows."""


def nesting_depth(raw: bytes | str) -> int:
    """An upper bound on how deep a JSON parser nests on ``raw``: brackets outside strings.

    Brackets inside strings are not counted; a quote where JSON allows none ends the parse there
    anyway, so the bound holds for any input, valid or not.
    """
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
    openers = len(data) - len(data.translate(None, b"[{"))  # both openers in one C pass
    if openers <= MAX_JSON_DEPTH:
        return openers  # cannot be deeper than the number of openers
    brackets = np.frombuffer(_NOT_BRACKET.sub(b"", _STRING.sub(b"", data)), dtype=np.uint8)
    steps = np.where(np.isin(brackets, _OPEN), 1, -1)
    return int(np.cumsum(steps).max(initial=0))


def check_depth(raw: bytes | str, what: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise TooDeep(f"{what} nests {depth} levels deep; at most {max_depth} are accepted")


def loads(raw: bytes | str, what: str = "the JSON document", max_depth: int = MAX_JSON_DEPTH, **kwargs) -> Any:
    """``json.loads`` after ``check_depth``: TooDeep (a ValueError) for a document too deep."""
    check_depth(raw, what, max_depth)
    return json.loads(raw, **kwargs)
