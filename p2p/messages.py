"""Protocol messages: frozen dataclasses, msgpack encoding, strict schema validation.

Two protocols share the codec:
- ``/specmarket/draft/3.1.0`` (target <-> drafter): ``open``, ``advance`` and, last, ``settle`` from the
  target; ``payout`` (once, after ``open``) and ``draft`` back (an answer to the last message, or an
  *early draft* for a later round that names its ``basis``).
- ``/specmarket/generate/1.2.0`` (client <-> target): ``request`` from the client; ``chunk`` blocks,
  then ``done`` (or ``error``) back. A request with ``draft`` makes the client its own job's drafter:
  between the chunks the target sends it the draft protocol's ``open`` / ``advance``, and the client
  answers with ``draft`` frames on the same stream (node.client.drafting). 1.1.0 is the same without
  ``draft``; a request that leaves ``draft`` out (false) is a 1.1.0 request, so a plain client talks
  to either version.

Nothing received from the network is trusted: ``decode`` checks the frame size, the msgpack
structure, every field's type, every length, γ bounds and token ids < V before building a message.
The transport (varint-length-prefixed frames on a libp2p stream) lives beside this module.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import msgpack

from verifier.errors import SpecmarketError
from verifier.noise import MAX_SEED
from verifier.proposal import MAX_GAMMA

# What hosts listen on unless told: loopback; port 0 = the port of the node's last run if it is free
# (kept in its data dir, so a restarted node keeps its multiaddr), else any free port (p2p.host).
DEFAULT_LISTEN = "/ip4/127.0.0.1/tcp/0"

MAX_OPEN_DEADLINE_MS = 60_000  # the longest draft deadline a target keeps (node.target.config.MAX_DEADLINE_MS)
# 3.0.0: price, payout address, accepted counts, vouchers; 3.1.0: the open states the target's deadline;
# 3.2.0: a paying open names the escrow, chain, operator and lane it pays from, and the job's largest pay
DRAFT_PROTOCOL_ID = "/specmarket/draft/3.2.0"
# 1.1.0: answers end at end-of-sequence unless ignore_eos; 1.2.0: a request may ask to draft for itself
GENERATE_PROTOCOL_ID = "/specmarket/generate/1.2.0"
GENERATE_PROTOCOL_V1_1 = "/specmarket/generate/1.1.0"  # still served: a 1.1.0 client never drafts
MAX_FRAME_BYTES = 256 * 1024  # a 4k-token context as msgpack ints is < 20 KB; anything larger is hostile
MAX_CONTEXT_TOKENS = 8192
MAX_JOB_ID_BYTES = 64
MAX_PROMPT_BYTES = 64 * 1024
MAX_TEXT_BYTES = 64 * 1024
MAX_NEW_TOKENS = 4096
MAX_MAP_ENTRIES = 64  # stats / credits maps in a ``done`` frame
MAX_KEY_BYTES = 128
MAX_RECEIPT_BYTES = 128 * 1024  # a receipt with its prompt and output tokens, as JSON
MAX_DRAFT_MS = 600_000.0  # a drafter's reported time for one draft (informational, untrusted)
MAX_PRICE_WEI = 10**18  # per accepted draft token: one ETH a token is past any sane price
MAX_VOUCHER_BYTES = 1024  # node.chain.vouchers.MAX_VOUCHER_BYTES: a signed voucher as JSON is ~450 bytes
MAX_U64 = (1 << 64) - 1  # a lane id, a chain id
MAX_PAY_WEI = MAX_PRICE_WEI * MAX_NEW_TOKENS  # a job's largest pay at the largest price
ADDRESS_CHARS = 42  # 0x + 40 hex digits


class InvalidMessage(SpecmarketError):
    """A frame that is too large, not msgpack, or fails the schema."""


@dataclass(frozen=True)
class Open:
    """target -> drafter: start a job (context so far, sampling params, the shared seed, γ), the
    price the operator pays per accepted draft token, in wei (0: this target pays nothing), and how
    long the target waits for an answer to an advance, in ms (0: not stated), so that an honest
    drafter sizes its answers to arrive in time (node.drafter.session, "Answers in time").

    A paying open (``price_wei`` > 0) also names where the pay comes from: the DrafterEscrow
    (``chain_id``, ``escrow``), the ``operator`` that signs the vouchers, the operator's ``lane`` for this
    drafter, and ``max_pay_wei``, the most this job can pay it (price x the job's token budget), so
    that a drafter can check on chain, before any work, that its lane covers what is owed plus this
    job (node.drafter.cover). An unpaid open leaves them empty / 0."""

    job: str
    context: tuple[int, ...]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    gamma: int
    start: int  # k of the first token to draft (context[-1] is the last accepted token)
    price_wei: int = 0
    deadline_ms: int = 0
    chain_id: int = 0
    escrow: str = ""
    operator: str = ""
    lane: int = 0
    max_pay_wei: int = 0


@dataclass(frozen=True)
class PayTerms:
    """What a target's opens offer for one job: ``Open``'s payment fields (all empty: unpaid)."""

    price_wei: int = 0
    chain_id: int = 0
    escrow: str = ""
    operator: str = ""
    lane: int = 0
    max_pay_wei: int = 0


UNPAID = PayTerms()


@dataclass(frozen=True)
class Advance:
    """target -> drafter: the tokens emitted since the last message; drafting resumes at ``start``.
    ``accepted``: this drafter's draft tokens accepted in this job so far, as the target credits them."""

    job: str
    tokens: tuple[int, ...]
    start: int  # k of the next token to draft
    accepted: int = 0


@dataclass(frozen=True)
class Payout:
    """drafter -> target, once per session, before its first draft: where to pay this drafter. The
    Noise-authenticated stream binds it to the drafter's peer id."""

    job: str
    address: str  # 0x + 40 hex digits


@dataclass(frozen=True)
class Settle:
    """target -> drafter, the session's last message: the job's accepted draft tokens of this drafter
    and the operator's newest cumulative voucher for it (node.chain.vouchers JSON; "" when unpaid)."""

    job: str
    accepted: int
    voucher: str = ""


@dataclass(frozen=True)
class Draft:
    """drafter -> target: up to γ tokens for indices start .. start+len-1.

    ``basis`` (at most γ+1 ids) is what the drafter assumes occupies indices start-len(basis) ..
    start-1: empty for an answer to ``open``/``advance`` (start = that message's k), non-empty for
    an *early draft* of a later round. The target uses a draft for the round at k only if start == k
    and the basis equals the tokens it emitted there. ``draft_ms`` is the drafter's own account of its
    time on the draft (for reporting the transport share of a round trip only; never trusted).
    """

    job: str
    start: int
    tokens: tuple[int, ...]
    basis: tuple[int, ...] = ()
    draft_ms: float = 0.0


@dataclass(frozen=True)
class Request:
    """client -> target: generate up to ``max_new_tokens`` after ``prompt``, ending at the model's
    end-of-sequence tokens unless ``ignore_eos``; seed None = the target picks."""

    prompt: str
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    ignore_eos: bool = False
    draft: bool = False  # 1.2.0: the client drafts for this request itself (never paid, never in the market)


@dataclass(frozen=True)
class Chunk:
    """target -> client: newly verified tokens and the text they add."""

    tokens: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Done:
    """target -> client: the job's summary (all generated ids, seed, stats, per-drafter credits)."""

    job: str
    tokens: tuple[int, ...]
    seed: int
    stats: dict[str, float]
    credits: dict[str, int]
    receipt: str = ""  # the operator's signed receipt as JSON (node.chain.receipts), "" when unbonded


@dataclass(frozen=True)
class Error:
    """target -> client: the request failed; ``message`` says why. drafter -> target: the drafter
    refuses the session (it is full); a refusal, not a failure."""

    message: str


Message = Open | Advance | Payout | Settle | Draft | Request | Chunk | Done | Error
_KINDS: dict[str, type] = {
    "open": Open,
    "advance": Advance,
    "payout": Payout,
    "settle": Settle,
    "draft": Draft,
    "request": Request,
    "chunk": Chunk,
    "done": Done,
    "error": Error,
}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}
TO_DRAFTER = frozenset({"open", "advance", "settle"})
TO_TARGET = frozenset({"draft", "payout", "error"})
TO_SERVER = frozenset({"request"})
TO_CLIENT = frozenset({"chunk", "done", "error"})
# a drafting client's stream: after its request only drafts (or an error: it stops drafting) go to the
# target; the draft protocol's open and advance come to the client between the chunks
TO_SERVER_DRAFTING = frozenset({"draft", "error"})
TO_CLIENT_DRAFTING = TO_CLIENT | {"open", "advance"}
# fields added by a later protocol version: a frame may leave them out (an older peer's); they then
# take their defaults, and are left out of a frame when they hold their defaults
_OPTIONAL: dict[str, frozenset[str]] = {"request": frozenset({"draft"})}


def encode(message: Message) -> bytes:
    kind = _KIND_OF[type(message)]
    fields = asdict(message)
    for name in _OPTIONAL.get(kind, ()):
        if fields[name] == type(message).__dataclass_fields__[name].default:
            del fields[name]
    body = {"type": kind, **fields}
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


def _str(body: dict, name: str, max_bytes: int, *, empty_ok: bool = False) -> str:
    value = body.get(name)
    if not isinstance(value, str) or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        raise InvalidMessage(f"field {name!r} must be a string of at most {max_bytes} bytes")
    if not value and not empty_ok:
        raise InvalidMessage(f"field {name!r} must not be empty")
    return value


def _job(body: dict) -> str:
    return _str(body, "job", MAX_JOB_ID_BYTES)


def _map(body: dict, name: str, *, integers: bool) -> dict:
    value = body.get(name)
    if not isinstance(value, dict) or len(value) > MAX_MAP_ENTRIES:
        raise InvalidMessage(f"field {name!r} must be a map of at most {MAX_MAP_ENTRIES} entries")
    kinds = (int,) if integers else (int, float)
    for key, item in value.items():
        if not isinstance(key, str) or not 0 < len(key.encode()) <= MAX_KEY_BYTES:
            raise InvalidMessage(f"field {name!r} has a bad key {key!r}")
        if isinstance(item, bool) or not isinstance(item, kinds) or not math.isfinite(item):
            raise InvalidMessage(f"field {name!r}[{key!r}] must be a finite {'integer' if integers else 'number'}")
    return dict(value)


def _open(body: dict, vocab: int, max_gamma: int) -> Open:
    context = _tokens(body, "context", MAX_CONTEXT_TOKENS, vocab)
    if not context:
        raise InvalidMessage("an open message needs a non-empty context")
    return Open(
        _job(body),
        context,
        _float(body, "temperature", 0.0, 100.0),
        _int(body, "top_k", 0, vocab),
        _float(body, "top_p", 1e-9, 1.0),
        _int(body, "seed", 0, MAX_SEED),
        _int(body, "gamma", 1, max_gamma),
        _int(body, "start", 0, MAX_CONTEXT_TOKENS),
        *_open_terms(body),
    )


def _open_terms(body: dict) -> tuple[int, int, int, str, str, int, int]:
    """An open's price, deadline and payment terms: a paying open names its escrow and operator."""
    price_wei = _int(body, "price_wei", 0, MAX_PRICE_WEI)
    deadline_ms = _int(body, "deadline_ms", 0, MAX_OPEN_DEADLINE_MS)
    chain_id, lane = _int(body, "chain_id", 0, MAX_U64), _int(body, "lane", 0, MAX_U64)
    max_pay_wei = _int(body, "max_pay_wei", 0, MAX_PAY_WEI)
    if not price_wei:
        escrow, operator = _str(body, "escrow", 0, empty_ok=True), _str(body, "operator", 0, empty_ok=True)
        return price_wei, deadline_ms, chain_id, escrow, operator, lane, max_pay_wei
    escrow, operator = _address(body, "escrow"), _address(body, "operator")
    if not chain_id or not max_pay_wei:
        raise InvalidMessage("a paying open names its chain id and its largest pay (max_pay_wei > 0)")
    return price_wei, deadline_ms, chain_id, escrow, operator, lane, max_pay_wei


def _address(body: dict, name: str) -> str:
    value = _str(body, name, ADDRESS_CHARS)
    if len(value) != ADDRESS_CHARS or value[:2] != "0x" or not all(c in string.hexdigits for c in value[2:]):
        raise InvalidMessage(f"field {name!r} must be an address (0x + 40 hex digits), got {value!r:.60}")
    return value


def _request(body: dict, vocab: int, max_gamma: int) -> Request:
    seed = None if body.get("seed") is None else _int(body, "seed", 0, MAX_SEED)
    return Request(
        _str(body, "prompt", MAX_PROMPT_BYTES),
        _int(body, "max_new_tokens", 1, MAX_NEW_TOKENS),
        _float(body, "temperature", 0.0, 100.0),
        _int(body, "top_k", 0, vocab),
        _float(body, "top_p", 1e-9, 1.0),
        seed,
        _flag(body, "ignore_eos"),
        _flag(body, "draft") if "draft" in body else False,
    )


def _flag(body: dict, name: str) -> bool:
    """A boolean field; anything but true or false is refused."""
    value = body[name]
    if not isinstance(value, bool):
        raise InvalidMessage(f"field {name!r} must be a boolean, got {type(value).__name__}")
    return value


def _draft(body: dict, vocab: int, max_gamma: int) -> Draft:
    start = _int(body, "start", 0, MAX_CONTEXT_TOKENS)
    basis = _tokens(body, "basis", max_gamma + 1, vocab)
    if len(basis) > start:
        raise InvalidMessage(f"a basis of {len(basis)} tokens before start={start} would begin at k < 0")
    return Draft(
        _job(body), start, _tokens(body, "tokens", max_gamma, vocab), basis, _float(body, "draft_ms", 0.0, MAX_DRAFT_MS)
    )


_BUILDERS: dict[str, Callable[[dict, int, int], Message]] = {
    "open": _open,
    "advance": lambda b, v, g: Advance(
        _job(b),
        _tokens(b, "tokens", MAX_CONTEXT_TOKENS, v),
        _int(b, "start", 0, MAX_CONTEXT_TOKENS),
        _int(b, "accepted", 0, MAX_CONTEXT_TOKENS),
    ),
    "payout": lambda b, v, g: Payout(_job(b), _address(b, "address")),
    "settle": lambda b, v, g: Settle(
        _job(b), _int(b, "accepted", 0, MAX_CONTEXT_TOKENS), _str(b, "voucher", MAX_VOUCHER_BYTES, empty_ok=True)
    ),
    "draft": _draft,
    "request": _request,
    "chunk": lambda b, v, g: Chunk(
        _tokens(b, "tokens", MAX_NEW_TOKENS, v), _str(b, "text", MAX_TEXT_BYTES, empty_ok=True)
    ),
    "done": lambda b, v, g: Done(
        _job(b),
        _tokens(b, "tokens", MAX_NEW_TOKENS, v),
        _int(b, "seed", 0, MAX_SEED),
        _map(b, "stats", integers=False),
        _map(b, "credits", integers=True),
        _str(b, "receipt", MAX_RECEIPT_BYTES, empty_ok=True),
    ),
    "error": lambda b, v, g: Error(_str(b, "message", MAX_TEXT_BYTES)),
}


def decode(
    frame: bytes, *, vocab_size: int, max_gamma: int = MAX_GAMMA, allowed: frozenset[str] | None = None
) -> Message:
    """Parse and validate one frame; raise InvalidMessage saying exactly what is wrong.

    ``allowed`` names the message types acceptable in this direction of this protocol.
    """
    if len(frame) > MAX_FRAME_BYTES:
        raise InvalidMessage(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        body: Any = msgpack.unpackb(frame, raw=False, strict_map_key=True)  # size already bounded above
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise InvalidMessage(f"frame is not valid msgpack: {exc}") from exc
    if not isinstance(body, dict):
        raise InvalidMessage(f"frame must be a msgpack map, got {type(body).__name__}")
    kind = body.get("type")
    if not isinstance(kind, str) or kind not in _KINDS or (allowed is not None and kind not in allowed):
        raise InvalidMessage(f"unexpected message type {kind!r}")
    expected = {"type", *_KINDS[kind].__dataclass_fields__}
    if not set(body) <= expected or not expected - _OPTIONAL.get(kind, frozenset()) <= set(body):
        raise InvalidMessage(f"{kind} message fields {sorted(map(str, body))} != {sorted(expected)}")
    return _BUILDERS[kind](body, vocab_size, max_gamma)
