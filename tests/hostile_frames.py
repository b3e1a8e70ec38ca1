"""Hypothesis strategies for hostile wire bytes: whole, truncated and oversized frames."""

from __future__ import annotations

import msgpack
from hypothesis import strategies as st
from libp2p.utils.varint import encode_uvarint

from p2p.messages import MAX_FRAME_BYTES

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=16),
    st.binary(max_size=16),
    st.lists(st.integers(min_value=-5, max_value=10_000), max_size=24),
)
# valid messages; one-field mutations of them probe each field's validation
OPEN_BODY = {
    "type": "open",
    "job": "j",
    "context": [1, 2],
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "seed": 3,
    "gamma": 4,
    "start": 0,
}
REQUEST_BODY = {
    "type": "request",
    "prompt": "x",
    "max_new_tokens": 4,
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "seed": None,
    "ignore_eos": False,
}
# a draft for k = 2 that names the two tokens it assumes were emitted before it (see test_remote_fuzz)
DRAFT_BODY = {"type": "draft", "job": "job-1", "start": 2, "tokens": [1, 2, 3], "basis": [17, 99], "draft_ms": 1.5}


def _mutated(base: dict) -> st.SearchStrategy[bytes]:
    """A valid message with one field replaced, removed, or added."""
    keys = sorted(base)
    return st.one_of(
        st.tuples(st.sampled_from(keys), _VALUES).map(lambda kv: {**base, kv[0]: kv[1]}),
        st.sampled_from(keys).map(lambda k: {key: v for key, v in base.items() if key != k}),
        st.tuples(st.text(min_size=1, max_size=8), _VALUES).map(lambda kv: {**base, kv[0]: kv[1]}),
    ).map(lambda body: msgpack.packb(body, use_bin_type=True))


def _bodies(base: dict) -> st.SearchStrategy[bytes]:
    maps = st.dictionaries(st.text(max_size=8), _VALUES, max_size=8).map(lambda d: msgpack.packb(d))
    return st.one_of(st.binary(max_size=600), maps, _mutated(base))


def frames_for(base: dict) -> st.SearchStrategy[tuple[str, bytes]]:
    """(kind, bytes on the wire): whole frames, truncated ones, and oversized length prefixes."""
    return st.one_of(
        _bodies(base).map(lambda b: ("whole", encode_uvarint(len(b)) + b)),
        _bodies(base).map(lambda b: ("truncated", encode_uvarint(len(b) + 7) + b)),
        st.integers(MAX_FRAME_BYTES + 1, 2**40).map(lambda n: ("oversized", encode_uvarint(n) + b"\x00" * 64)),
    )
