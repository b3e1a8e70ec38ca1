"""Draft-protocol message schema: round trips, and hostile frames never crash the decoder."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p.messages import (
    MAX_FRAME_BYTES,
    MAX_OPEN_DEADLINE_MS,
    MAX_PRICE_WEI,
    TO_CLIENT_DRAFTING,
    TO_DRAFTER,
    TO_SERVER_DRAFTING,
    Advance,
    Chunk,
    Done,
    Draft,
    Error,
    InvalidMessage,
    Open,
    Payout,
    Request,
    Settle,
    decode,
    encode,
)

V = 4096
GOOD = [
    Open("job-1", (0, 5, 17), 0.8, 40, 0.95, 2**64 - 1, 4, 3),
    Advance("job-1", (3, 9), 7),
    # a paying target announces its price, and where the pay comes from
    Open(
        "job-1",
        (0, 5),
        0.8,
        40,
        0.95,
        1,
        4,
        1,
        MAX_PRICE_WEI,
        100,
        31337,
        "0x" + "ab" * 20,
        "0x" + "cd" * 20,
        2**64 - 1,
        5,
    ),
    Advance("job-1", (3, 9), 7, 12),  # ... and each drafter's accepted tokens so far
    Payout("job-1", "0x" + "Ab" * 20),
    Settle("job-1", 12, '{"format": 1}'),
    Settle("job-1", 0),
    Draft("job-1", 7, (1, 2, 3, 4)),
    Draft("j", 0, ()),
    Draft("job-1", 12, (1, 2, 3, 4), (5, 6, 7, 8, 9), 12.5),  # an early draft: basis at k = 7 .. 11
    Draft("j", 5, (), (1, 2, 3, 4, 5), 0.0),  # the basis may reach back to k = 0
    Request("def f(", 32, 0.7, 0, 0.9, None),
    Request("x", 1, 1.0, 5, 1.0, 12),
    Request("x", 1, 1.0, 5, 1.0, 12, ignore_eos=True, draft=True),  # 1.2.0: the client drafts for itself
    Chunk((1, 2), "ab"),
    Chunk((), ""),
    Done("job", (1, 2, 3), 9, {"acceptance_rate": 0.5, "target_passes": 3}, {"12D3Koo": 2}),
    Done("job", (1,), 9, {}, {}, '{"format": 1}'),
    Error("context too long"),
]


@pytest.mark.parametrize("message", GOOD)
def test_round_trip(message):
    assert decode(encode(message), vocab_size=V) == message


def _frame(**body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def _draft(**overrides) -> bytes:
    return _frame(**{"type": "draft", "job": "j", "start": 0, "tokens": [], "basis": [], "draft_ms": 0.0, **overrides})


def _open(**overrides) -> bytes:
    body = {"type": "open", "job": "j", "context": [1], "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    terms = {"chain_id": 0, "escrow": "", "operator": "", "lane": 0, "max_pay_wei": 0}
    return _frame(**{**body, "gamma": 4, "start": 0, "price_wei": 0, "deadline_ms": 100, **terms, **overrides})


PAYING = {"price_wei": 1, "chain_id": 31337, "escrow": "0x" + "ab" * 20, "operator": "0x" + "cd" * 20, "max_pay_wei": 9}


def _settle(**overrides) -> bytes:
    return _frame(**{"type": "settle", "job": "j", "accepted": 3, "voucher": "", **overrides})


def _payout(**overrides) -> bytes:
    return _frame(**{"type": "payout", "job": "j", "address": "0x" + "ab" * 20, **overrides})


@pytest.mark.parametrize(
    "frame,message",
    [
        (b"\xc1", "not valid msgpack"),
        (b"\x92\x01", "not valid msgpack"),  # truncated array
        (_draft(tokens=[V]), "not a token id"),
        (_draft(tokens=[-1]), "not a token id"),
        (_draft(tokens=[True]), "not a token id"),
        (_draft(tokens=list(range(17))), "at most 16"),
        (_draft(start=-1), "'start'"),
        (_draft(job=""), "'job'"),
        (_draft(job="j" * 65), "'job'"),
        (_draft(extra=1), "fields"),
        (_frame(type="draft", job="j", start=0, tokens=[]), "fields"),  # a 1.0.0 draft: no basis, no draft_ms
        (_draft(start=20, basis=list(range(18))), "'basis' must be a list of at most 17"),  # > γ+1 (γ = 16)
        (_draft(start=2, basis=[1, 2, 3]), "k < 0"),
        (_draft(start=3, basis=[1, 2.0]), "'basis' holds 2.0"),
        (_draft(start=3, basis=[1, True]), "'basis' holds True"),
        (_draft(start=3, basis=["a"]), "'basis' holds 'a'"),
        (_draft(start=3, basis=[V]), "'basis' holds 4096"),
        (_draft(start=3, basis=1), "'basis' must be a list"),
        (_draft(draft_ms=-1.0), "'draft_ms'"),
        (_draft(draft_ms=float("nan")), "'draft_ms'"),
        (_draft(draft_ms=float("inf")), "'draft_ms'"),
        (_draft(draft_ms=1e9), "'draft_ms'"),
        (_draft(draft_ms=True), "'draft_ms'"),
        (_draft(draft_ms="5"), "'draft_ms'"),
        (_frame(type="bogus"), "unexpected message type"),
        (msgpack.packb([1, 2, 3]), "msgpack map"),
        (_open(context=[]), "non-empty"),
        (_open(temperature=-1.0), "temperature"),
        (_open(gamma=0), "gamma"),
        (_open(gamma=17), "gamma"),
        (_open(seed=-5), "seed"),
        (_open(top_p=0.0), "top_p"),
        (_open(context=[1] * 8193), "context"),
        (_open(price_wei=MAX_PRICE_WEI + 1), "price_wei"),
        (_open(price_wei=-1), "price_wei"),
        (_open(deadline_ms=-1), "deadline_ms"),
        (_open(deadline_ms=MAX_OPEN_DEADLINE_MS + 1), "deadline_ms"),
        (_open(deadline_ms=2.5), "deadline_ms"),
        (_open(**{**PAYING, "escrow": ""}), "escrow"),  # a paying open names its escrow ...
        (_open(**{**PAYING, "operator": "0x12"}), "operator"),  # ... and its operator, as addresses
        (_open(**{**PAYING, "max_pay_wei": 0}), "largest pay"),
        (_open(**{**PAYING, "chain_id": 0}), "chain id"),
        (_open(**{**PAYING, "lane": -1}), "lane"),
        (_open(escrow="x"), "escrow"),  # an unpaid one names none
        (_frame(**{**{k: v for k, v in PAYING.items() if k != "max_pay_wei"}, "type": "open"}), "fields"),
        (
            _frame(
                type="open",
                job="j",
                context=[1],
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                seed=0,
                gamma=4,
                start=0,
                price_wei=0,
            ),
            "fields",
        ),  # a 3.0.0 open: no deadline; fmt: skip
        (_frame(type="advance", job="j", tokens=[1], start=1), "fields"),  # a 2.0.0 advance: no accepted count
        (_frame(type="advance", job="j", tokens=[1], start=1, accepted=-1), "accepted"),
        (_payout(address="0x" + "ab" * 19), "address"),
        (_payout(address="0x" + "zz" * 20), "address"),
        (_payout(address="ab" * 21), "address"),
        (_payout(address=5), "address"),
        (_settle(accepted=1.5), "accepted"),
        (_settle(voucher="x" * 1025), "voucher"),
        (_settle(voucher=None), "voucher"),
        (b"\x00" * (MAX_FRAME_BYTES + 1), "exceeds"),
        (
            _frame(
                type="request",
                prompt="",
                max_new_tokens=1,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                seed=None,
                ignore_eos=False,
            ),
            "empty",
        ),
        (
            _frame(
                type="request",
                prompt="a",
                max_new_tokens=0,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                seed=1,
                ignore_eos=True,
            ),
            "max_new",
        ),
        (
            _frame(
                type="request", prompt=1, max_new_tokens=1, temperature=1.0, top_k=0, top_p=1.0, seed=1, ignore_eos=True
            ),
            "prompt",
        ),
        (
            _frame(
                type="request", prompt="a", max_new_tokens=1, temperature=1.0, top_k=0, top_p=1.0, seed=1, ignore_eos=1
            ),
            "boolean",
        ),
        (_frame(type="done", job="j", tokens=[], seed=0, stats={"a": float("nan")}, credits={}, receipt=""), "finite"),
        (_frame(type="done", job="j", tokens=[], seed=0, stats={}, credits={"p": 1.5}, receipt=""), "integer"),
        (_frame(type="done", job="j", tokens=[], seed=0, stats={}, credits={"": 1}, receipt=""), "bad key"),
        (_frame(type="done", job="j", tokens=[], seed=0, stats={}, credits={}, receipt="x" * (1 << 18)), "bytes"),
        (_frame(type="error", message=""), "empty"),
        (_frame(type=[1], job="j"), "unexpected message type"),  # unhashable type value (found by fuzzing)
        (_frame(type={"a": 1}), "unexpected message type"),
    ],
)
def test_bad_frames_are_rejected_with_a_clear_message(frame, message):
    with pytest.raises(InvalidMessage, match=message):
        decode(frame, vocab_size=V)


def test_basis_is_bounded_by_the_sessions_gamma():
    """With γ = 4 (the target's FrameStream passes its γ) a basis may hold γ+1 = 5 ids, not 6."""
    ok = _draft(start=9, tokens=[1, 2, 3, 4], basis=[1, 2, 3, 4, 5])
    assert decode(ok, vocab_size=V, max_gamma=4).basis == (1, 2, 3, 4, 5)
    with pytest.raises(InvalidMessage, match="'basis' must be a list of at most 5"):
        decode(_draft(start=9, basis=[1, 2, 3, 4, 5, 6]), vocab_size=V, max_gamma=4)
    with pytest.raises(InvalidMessage, match="'tokens' must be a list of at most 4"):
        decode(_draft(start=9, tokens=[1, 2, 3, 4, 5]), vocab_size=V, max_gamma=4)


def test_oversized_outgoing_message_is_refused():
    with pytest.raises(InvalidMessage, match="refusing"):
        encode(Advance("j", tuple(range(100_000)), 0))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_crash_the_decoder(frame):
    with contextlib.suppress(InvalidMessage):
        decode(frame, vocab_size=V)


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["open", "advance", "draft", "x"]), st.dictionaries(st.text(max_size=12), _values, max_size=9))
def test_structured_garbage_never_crashes_the_decoder(kind, body):
    with contextlib.suppress(InvalidMessage):
        decode(msgpack.packb({**body, "type": kind}, use_bin_type=True), vocab_size=V)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(GOOD), st.integers(min_value=0, max_value=200))
def test_truncated_frames_never_crash_the_decoder(message, cut):
    frame = encode(message)
    try:
        assert decode(frame[: min(cut, len(frame))], vocab_size=V) == message
    except InvalidMessage:
        assert cut < len(frame)


def test_direction_is_enforced():
    """A drafter only accepts open/advance; a draft frame sent to it is refused."""
    frame = encode(Draft("j", 0, (1,)))
    with pytest.raises(InvalidMessage, match="unexpected message type 'draft'"):
        decode(frame, vocab_size=V, allowed=TO_DRAFTER)
    assert decode(encode(Advance("j", (1,), 1)), vocab_size=V, allowed=TO_DRAFTER) == Advance("j", (1,), 1)


def test_a_plain_request_is_a_1_1_0_request_and_a_drafting_one_names_draft():
    """A 1.1.0 target checks a request's exact field set: a plain request must keep that shape, so a
    new client talks to an old target; ``draft`` goes out only when set, and must be a boolean."""
    plain = msgpack.unpackb(encode(Request("x", 1, 1.0, 5, 1.0, 12)))
    assert set(plain) == {"type", "prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "ignore_eos"}
    assert msgpack.unpackb(encode(Request("x", 1, 1.0, 5, 1.0, 12, draft=True)))["draft"] is True
    with pytest.raises(InvalidMessage, match="'draft' must be a boolean"):
        decode(msgpack.packb({**plain, "draft": 1}), vocab_size=V)
    with pytest.raises(InvalidMessage, match="fields"):  # only fields a later version added may be left out
        decode(msgpack.packb({k: v for k, v in plain.items() if k != "ignore_eos"}), vocab_size=V)


def test_a_drafting_clients_stream_admits_drafts_only_after_its_request():
    """The target reads drafts (and an error) from a drafting client; never a payout (it is never
    paid) nor a second request. The client reads the draft protocol's open and advance besides."""
    with pytest.raises(InvalidMessage, match="unexpected message type 'payout'"):
        decode(encode(Payout("j", "0x" + "ab" * 20)), vocab_size=V, allowed=TO_SERVER_DRAFTING)
    with pytest.raises(InvalidMessage, match="unexpected message type 'request'"):
        decode(encode(Request("x", 1, 1.0, 5, 1.0, 12)), vocab_size=V, allowed=TO_SERVER_DRAFTING)
    assert decode(encode(Draft("j", 3, (1,))), vocab_size=V, allowed=TO_SERVER_DRAFTING) == Draft("j", 3, (1,))
    for message in (Open("j", (1,), 0.8, 0, 1.0, 5, 4, 0), Advance("j", (1,), 2), Chunk((1,), "a")):
        assert decode(encode(message), vocab_size=V, allowed=TO_CLIENT_DRAFTING) == message
    with pytest.raises(InvalidMessage, match="unexpected message type 'settle'"):
        decode(encode(Settle("j", 1)), vocab_size=V, allowed=TO_CLIENT_DRAFTING)
