"""One request must not crash a target: deeply nested input on every decoder that takes bytes from
outside (issue: hardening, item "one request").

Importing web3 raises the interpreter's recursion limit to 100,000 (py_ecc), so the C JSON decoder
overflowed the C stack on a 200 KB body of nested brackets: exit 139, nothing logged. Each decoder
now bounds the depth first. Against a real target process, a real drafter peer and real libp2p
hosts on loopback.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request

import msgpack
import pytest
import trio
from libp2p.exceptions import BaseLibp2pError
from libp2p.utils.varint import encode_uvarint

from node.chain.challenger import read_receipt_file
from node.chain.receipts import ReceiptError
from node.cli.options import ConfigError, load_section
from p2p.framing import FrameStream
from p2p.host import parse_peer_addr, peer_addrs
from p2p.messages import DRAFT_PROTOCOL_ID, GENERATE_PROTOCOL_ID, MAX_FRAME_BYTES, TO_CLIENT, TO_TARGET, Draft, Open
from p2p.messages import Error as ErrorFrame
from p2p.safe_json import MAX_JSON_DEPTH, TooDeep, loads, nesting_depth
from tests import netutil
from tests.netutil import complete, start_target

DEPTH = 100_000
DEEP_BODY = b'{"prompt":"x","max_tokens":4,"a":' + b"[" * DEPTH + b"]" * DEPTH + b"}"
FRAME_DEPTH = MAX_FRAME_BYTES // 2  # as deep as a frame under the size limit can nest
READ_TIMEOUT_S = 30.0


def test_nesting_depth_counts_brackets_outside_strings_succeeds():
    assert nesting_depth(b'{"a": [1, {"b": [2]}]}') <= 4
    assert nesting_depth(b"[" * 100 + b"]" * 100) == 100
    assert nesting_depth(b'{"s": "' + b"[" * 500 + b'"}') <= MAX_JSON_DEPTH  # brackets in a string
    assert nesting_depth(b'{"s": "\\"' + b"[" * 500 + b'"}') <= MAX_JSON_DEPTH  # after an escaped quote
    assert nesting_depth(DEEP_BODY) == DEPTH + 1
    nested = json.dumps([[[[{"x": [1]}]]]] * 30)  # many brackets, little depth
    assert loads(nested) == json.loads(nested)


def test_nesting_depth_counts_both_openers_on_its_fast_path_succeeds():
    """Up to MAX_JSON_DEPTH openers the bound is their number, ``[`` and ``{`` alike (inside strings
    too: it is an upper bound), for bytes and str; one more and the brackets are walked."""
    assert nesting_depth(b"") == nesting_depth("") == 0
    assert nesting_depth(b'{"a": [1, {"b": [2]}]}') == 4
    assert nesting_depth('{"é": ["[", "{"], "\ud800": 1}') == 4
    assert nesting_depth(b"[{" * (MAX_JSON_DEPTH // 2)) == MAX_JSON_DEPTH
    assert nesting_depth(b"[" * (MAX_JSON_DEPTH + 1)) == MAX_JSON_DEPTH + 1
    assert nesting_depth(b'["' + b"{" * MAX_JSON_DEPTH + b'"]') == 1


def test_too_deep_json_is_refused_before_parsing_reverts():
    with pytest.raises(TooDeep, match=f"nests {DEPTH + 1} levels deep; at most {MAX_JSON_DEPTH}"):
        loads(DEEP_BODY, "the request body")
    assert isinstance(TooDeep("x"), ValueError)  # callers that catch bad JSON catch this too


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    node = start_target(tmp_path_factory.mktemp("deep"))
    yield node
    assert node.stop() == 0, node.log()[-3000:]


def test_deeply_nested_http_body_is_a_400_and_the_target_keeps_serving_succeeds(target):
    http = target.lines["http"][0]
    req = urllib.request.Request(f"{http}/v1/completions", data=DEEP_BODY, headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(req, timeout=READ_TIMEOUT_S)
    assert caught.value.code == 400
    error = json.loads(caught.value.read())["error"]
    assert error["code"] == "invalid_json" and "levels deep" in error["message"]
    assert target.proc.poll() is None, target.log()[-3000:]
    assert len(complete(http, "def f(x):", seed=1, max_tokens=4)["specmarket"]["tokens"]) == 4


def _deep_frame(body: dict, field: str) -> bytes:
    """``body`` with ``field`` replaced by FRAME_DEPTH nested one-element arrays, as a wire frame."""
    head = msgpack.packb({**{k: v for k, v in body.items() if k != field}, field: None})  # the field last
    assert head.endswith(b"\xc0")
    frame = head[:-1] + b"\x91" * FRAME_DEPTH + b"\xc0"  # fixarray of one element, FRAME_DEPTH times
    return encode_uvarint(len(frame)) + frame


def test_deeply_nested_generate_frame_gets_an_error_frame_and_the_target_keeps_serving_succeeds(
    portal, attacker, target, pair
):
    peer = parse_peer_addr(target.lines["multiaddr"][0])
    request = {"type": "request", "prompt": "x", "max_new_tokens": 4, "temperature": 1.0, "top_k": 0}
    wire = _deep_frame({**request, "top_p": 1.0, "seed": None}, "prompt")

    async def go():
        await attacker.connect(peer)
        stream = await attacker.new_stream(peer.peer_id, [GENERATE_PROTOCOL_ID])
        await stream.write(wire)
        fs = FrameStream(stream, vocab_size=pair.target.vocab_size, allowed=TO_CLIENT)
        return await fs.receive(READ_TIMEOUT_S)

    answer = portal.run(go)
    assert isinstance(answer, ErrorFrame) and "invalid request" in answer.message and "msgpack" in answer.message
    assert target.proc.poll() is None, target.log()[-3000:]
    assert len(complete(target.lines["http"][0], "import os", seed=2, max_tokens=4)["specmarket"]["tokens"]) == 4


def test_deeply_nested_draft_protocol_frame_is_dropped_and_the_drafter_keeps_drafting_succeeds(portal, point, tmp_path):
    drafter = netutil.InProcessDrafter(portal, tmp_path, peer_addrs(point)[0], "honest")  # point: a hostile target
    try:
        peer = parse_peer_addr(drafter.addrs[0])
        vocab = drafter.node.model.vocab_size
        open_body = {"type": "open", "job": "j", "context": [1], "temperature": 1.0, "top_k": 0, "top_p": 1.0}
        wire = _deep_frame({**open_body, "seed": 3, "gamma": 4, "start": 0}, "context")

        async def go():
            await point.connect(peer)
            hostile = await point.new_stream(peer.peer_id, [DRAFT_PROTOCOL_ID])
            await hostile.write(wire)
            # dropped: nothing comes back, the stream ends (an EOF or a reset is a drop too)
            with trio.fail_after(READ_TIMEOUT_S), contextlib.suppress(BaseLibp2pError):
                assert await hostile.read(65536) == b""
            stream = await point.new_stream(peer.peer_id, [DRAFT_PROTOCOL_ID])
            fs = FrameStream(stream, vocab_size=vocab, allowed=TO_TARGET)
            await fs.send(Open("job-ok", (0, 5, 9), 1.0, 0, 1.0, 3, 4, 0), 5.0)
            return await fs.receive(READ_TIMEOUT_S)

        draft = portal.run(go)
        assert isinstance(draft, Draft) and draft.job == "job-ok" and 1 <= len(draft.tokens) <= 4
    finally:
        drafter.stop()


def test_deeply_nested_receipt_file_and_config_are_one_line_errors_reverts(tmp_path):
    receipt = tmp_path / "receipt.json"
    receipt.write_bytes(b'{"receipt":' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    with pytest.raises(ReceiptError, match="levels deep"):
        read_receipt_file(receipt)
    config = tmp_path / "node.toml"
    config.write_text("[target]\ngamma = " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(ConfigError, match="levels deep"):
        load_section(config, "target")
