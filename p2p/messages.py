"""Draft-protocol messages: frozen dataclasses, msgpack encoding, strict schema validation.

Nothing received from the network is trusted: ``decode`` checks the frame size, the msgpack
structure, every field's type, every length, γ bounds and token ids < V before building a message.
The transport (varint-length-prefixed frames on a libp2p stream) lives beside this module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import msgpack

from verifier.errors import SpecmarketError

DRAFT_PROTOCOL_ID = "/specmarket/draft/1.0.0"
MAX_FRAME_BYTES = 256 * 1024  # a 4k-token context as msgpack ints is < 20 KB; anything larger is hostile
MAX_CONTEXT_TOKENS = 8192
MAX_JOB_ID_BYTES = 64
MAX_GAMMA = 16  # same bound as verifier.proposal.MAX_GAMMA
MAX_SEED = (1 << 64) - 1


class InvalidMessage(SpecmarketError):
    """A frame that is too large, not msgpack, or fails the schema."""


@dataclass(frozen=True)
class Open:
    """target -> drafter: start a job (context so far, sampling params, the shared seed, γ)."""

    job: str
    context: tuple[int, ...]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    gamma: int


@dataclass(frozen=True)
class Advance:
    """target -> drafter: the tokens emitted since the last message; drafting resumes at ``start``."""

    job: str
    tokens: tuple[int, ...]
    start: int  # k of the next token to draft


@dataclass(frozen=True)
class Draft:
    """drafter -> target: up to γ tokens for indices start .. start+len-1."""

    job: str
    start: int
    tokens: tuple[int, ...]


Message = Open | Advance | Draft
_KINDS: dict[str, type] = {"open": Open, "advance": Advance, "draft": Draft}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


def encode(message: Message) -> bytes:
    body = {"type": _KIND_OF[type(message)], **asdict(message)}
    data = msgpack.packb(body, use_bin_type=True)
    if len(data) > MAX_FRAME_BYTES:
        raise InvalidMessage(f"refusing to send a {len(data)}-byte frame (max {MAX_FRAME_BYTES})")
    return data


def _int(body: dict, name: str, lo: int, hi: int) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidMessage(f"field {name!r} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _float(body: dict, name: str, lo: float, hi: float) -> float:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise InvalidMessage(f"field {name!r} must be a number in [{lo}, {hi}], got {value!r}")
    return float(value)


def _tokens(body: dict, name: str, max_len: int, vocab_size: int) -> tuple[int, ...]:
    value = body.get(name)
    if not isinstance(value, list) or len(value) > max_len:
        raise InvalidMessage(f"field {name!r} must be a list of at most {max_len} token ids")
    for t in value:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise InvalidMessage(f"field {name!r} holds {t!r}, not a token id in [0, {vocab_size})")
    return tuple(value)


def _job(body: dict) -> str:
    job = body.get("job")
    if not isinstance(job, str) or not 0 < len(job.encode()) <= MAX_JOB_ID_BYTES:
        raise InvalidMessage(f"field 'job' must be a non-empty string of at most {MAX_JOB_ID_BYTES} bytes")
    return job


def _build(kind: str, body: dict, vocab_size: int, max_gamma: int) -> Message:
    if kind == "open":
        context = _tokens(body, "context", MAX_CONTEXT_TOKENS, vocab_size)
        if not context:
            raise InvalidMessage("an open message needs a non-empty context")
        return Open(
            _job(body),
            context,
            _float(body, "temperature", 0.0, 100.0),
            _int(body, "top_k", 0, vocab_size),
            _float(body, "top_p", 1e-9, 1.0),
            _int(body, "seed", 0, MAX_SEED),
            _int(body, "gamma", 1, max_gamma),
        )
    if kind == "advance":
        return Advance(
            _job(body), _tokens(body, "tokens", max_gamma + 1, vocab_size), _int(body, "start", 0, MAX_CONTEXT_TOKENS)
        )
    return Draft(_job(body), _int(body, "start", 0, MAX_CONTEXT_TOKENS), _tokens(body, "tokens", max_gamma, vocab_size))


def decode(frame: bytes, *, vocab_size: int, max_gamma: int = MAX_GAMMA) -> Message:
    """Parse and validate one frame; raise InvalidMessage saying exactly what is wrong."""
    if len(frame) > MAX_FRAME_BYTES:
        raise InvalidMessage(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        body: Any = msgpack.unpackb(frame, raw=False, strict_map_key=True)  # size already bounded above
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise InvalidMessage(f"frame is not valid msgpack: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidMessage(f"frame must be a msgpack map, got {type(body).__name__}")
    kind = body.get("type")
    if kind not in _KINDS:
        raise InvalidMessage(f"unknown message type {kind!r}")
    expected = {"type", *_KINDS[kind].__dataclass_fields__}
    if set(body) != expected:
        raise InvalidMessage(f"{kind} message fields {sorted(map(str, body))} != {sorted(expected)}")
    return _build(kind, body, vocab_size, max_gamma)
