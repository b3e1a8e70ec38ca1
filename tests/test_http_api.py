"""The OpenAI-compatible HTTP API, end to end: real model, real Engine, real hypercorn, real clients.

The server's trio loop runs in a background thread (``tests.httputil.serving``), and every answer is
compared token for token with the local reference decoder (``node.model.decoding``).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import openai
import pytest

from node.client.http import ClientError, TargetHTTPError, TargetUnreachable, stream_completion
from node.model.decoding import GenerateConfig, generate
from node.target.engine import Engine
from node.target.http import api as http_api
from node.target.http.api import build_app
from tests.httputil import MODEL, async_client, metrics, post_json, request, serving, sync_client
from verifier.params import SamplingParams

PROMPT = "The quick brown fox"
ODD_PEER = '12D3KooWodd"peer\\x\ny'  # a label value that needs every Prometheus escape
STATUS = {
    "peer_id": "12D3KooWTarget",
    "multiaddrs": ["/ip4/127.0.0.1/tcp/4001"],
    "drafters": {
        "12D3KooWDrafterA": {
            "proposed": 10,
            "lifetime_proposed": 12,
            "matched": 8,
            "accepted": 6,
            "timeouts": 1,
            "latency_ms": 12.5,
            "consecutive_failures": 1,
            "benched": True,
            "bench_count": 2,
        },
        ODD_PEER: {"proposed": 3, "matched": 0, "accepted": 0, "timeouts": 0, "latency_ms": None},
    },
}


@dataclass(frozen=True)
class Servers:
    url: str  # build_app(engine, status=lambda: STATUS)
    bare_url: str  # build_app(engine): no status callable
    engine: Engine


@pytest.fixture(scope="module")
def servers(pair) -> Iterator[Servers]:
    engine = Engine(pair, model_name=MODEL, gamma=4)
    with serving({"main": build_app(engine, lambda: STATUS), "bare": build_app(engine)}) as urls:
        yield Servers(urls["main"], urls["bare"], engine)


@pytest.fixture(scope="module")
def reference(pair) -> Callable[..., dict]:
    cache: dict[tuple, dict] = {}

    def ref(prompt: str = PROMPT, seed: int = 7, n: int = 12, temperature: float = 1.0, top_p: float = 1.0) -> dict:
        key = (prompt, seed, n, temperature, top_p)
        if key not in cache:
            params = SamplingParams(temperature=temperature, top_p=top_p)
            cache[key] = generate(
                GenerateConfig(prompt, seed=seed, max_new_tokens=n, params=params, drafter="none"), pair
            )
        return cache[key]

    return ref


def check_full_answer(text: str, ext: dict, ref: dict, pair) -> None:
    assert ext["tokens"] == ref["tokens"]
    assert ext["prompt_tokens"] == ref["prompt_tokens"]
    assert ext["seed"] == ref["seed"]
    assert text == ref["text"] == pair.tokenizer.decode(ref["tokens"])
    assert ext["stats"]["target_passes"] == len(ref["tokens"])  # plain decoding: one pass per token
    assert ext["credits"] == {}


def split_stream(chunks: list[dict]) -> tuple[str, list[int], dict]:
    """(concatenated text, concatenated chunk token ids, the final chunk) of a streamed completion."""
    *body, final = chunks
    assert all(c["choices"][0]["finish_reason"] is None for c in body)
    assert final["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["text"] for c in chunks)
    tokens = [t for c in body for t in c["specmarket"]["tokens"]]
    assert len({c["id"] for c in chunks}) == 1
    return text, tokens, final


# --- the official openai client ---------------------------------------------------------------


def test_openai_sync_create(servers, reference, pair):
    resp = sync_client(servers.url).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, seed=7, temperature=1.0
    )
    ext = resp.model_extra["specmarket"]
    check_full_answer(resp.choices[0].text, ext, reference(), pair)
    assert resp.id == "cmpl-" + ext["job"]
    assert resp.model == MODEL
    assert resp.choices[0].finish_reason == "length"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (len(ext["prompt_tokens"]), 12)


def test_openai_sync_stream(servers, reference, pair):
    stream = sync_client(servers.url).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, seed=7, temperature=1.0, stream=True
    )
    text, tokens, final = split_stream([chunk.to_dict() for chunk in stream])
    ref = reference()
    assert tokens == ref["tokens"]
    check_full_answer(text, final["specmarket"], ref, pair)


@pytest.mark.asyncio
async def test_openai_async_create(servers, reference, pair):
    client = async_client(servers.url)
    async with client:
        resp = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, seed=7, temperature=1.0)
    check_full_answer(resp.choices[0].text, resp.to_dict()["specmarket"], reference(), pair)


@pytest.mark.asyncio
async def test_openai_async_stream(servers, reference, pair):
    client = async_client(servers.url)
    async with client:
        stream = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, seed=7, temperature=1.0, stream=True
        )
        chunks = [chunk.to_dict() async for chunk in stream]
    text, tokens, final = split_stream(chunks)
    assert tokens == reference()["tokens"]
    check_full_answer(text, final["specmarket"], reference(), pair)


@pytest.mark.asyncio
async def test_concurrent_async_requests(servers, reference, pair):
    cases = [("Once upon a time", 1, 10), ("def main():", 2, 8), (PROMPT, 3, 12)]
    refs = [reference(p, s, n) for p, s, n in cases]
    client = async_client(servers.url)
    async with client:
        calls = [client.completions.create(model=MODEL, prompt=p, max_tokens=n, seed=s) for p, s, n in cases]
        answers = await asyncio.gather(*calls)
    for resp, ref in zip(answers, refs, strict=True):
        check_full_answer(resp.choices[0].text, resp.model_extra["specmarket"], ref, pair)


def test_concurrent_threads_mixed_streaming(servers, reference, pair):
    cases = [("Hello world", 11, 9, False), ("import numpy as np", 12, 9, True), ("In 1492,", 13, 9, True)]
    refs = [reference(p, s, n) for p, s, n, _ in cases]

    def ask(case: tuple) -> tuple[str, dict]:
        prompt, seed, n, stream = case
        client = sync_client(servers.url)
        if stream:
            chunks = [
                c.to_dict()
                for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, seed=seed, stream=True)
            ]
            text, _, final = split_stream(chunks)
            return text, final["specmarket"]
        resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=n, seed=seed)
        return resp.choices[0].text, resp.model_extra["specmarket"]

    with ThreadPoolExecutor(len(cases)) as pool:
        answers = list(pool.map(ask, cases))
    for (text, ext), ref in zip(answers, refs, strict=True):
        check_full_answer(text, ext, ref, pair)
    assert len({ext["job"] for _, ext in answers}) == len(cases)


def test_sampling_params_are_honoured(servers, reference, pair):
    status, body = post_json(
        servers.url, {"prompt": PROMPT, "max_tokens": 6, "seed": 5, "temperature": 0.7, "top_p": 0.9}
    )
    assert status == 200
    check_full_answer(body["choices"][0]["text"], body["specmarket"], reference(PROMPT, 5, 6, 0.7, 0.9), pair)


def test_server_draws_and_reports_a_seed_when_none_is_given(servers, reference, pair):
    status, body = post_json(servers.url, {"prompt": PROMPT, "max_tokens": 4})
    assert status == 200
    seed = body["specmarket"]["seed"]
    assert isinstance(seed, int) and seed >= 0
    assert body["specmarket"]["tokens"] == reference(PROMPT, seed, 4)["tokens"]


# --- models, health, metrics --------------------------------------------------------------------


def test_models(servers):
    models = sync_client(servers.url).models.list()
    assert [m.id for m in models.data] == [MODEL]
    status, _, raw = request(servers.url, "GET", "/v1/models")
    body = json.loads(raw)
    assert status == 200 and body["object"] == "list"
    card = {"id": MODEL, "object": "model", "created": 0, "owned_by": "specmarket", "model_hash": None}
    assert body["data"][0] | {"created": 0} == card  # an engine told no hash says so


def test_health(servers):
    status, headers, raw = request(servers.url, "GET", "/health")
    body = json.loads(raw)
    assert status == 200 and headers["content-type"] == "application/json"
    assert body["status"] == "ok" and body["model"] == MODEL and body["active_jobs"] == 0
    assert body["peer_id"] == STATUS["peer_id"] and body["drafters"][ODD_PEER]["latency_ms"] is None
    status, _, raw = request(servers.bare_url, "GET", "/health")
    assert status == 200 and json.loads(raw) == {"status": "ok", "reason": "", "model": MODEL, "active_jobs": 0}


def test_metrics_counters_increase(servers):
    before, types, _ = metrics(servers.bare_url)
    assert types["specmarket_requests_total"] == "counter" and types["specmarket_active_jobs"] == "gauge"
    assert post_json(servers.url, {"prompt": PROMPT, "max_tokens": 5, "seed": 1})[0] == 200
    after, _, _ = metrics(servers.bare_url)
    delta = {k: after[k] - before[k] for k in before}
    assert delta["specmarket_requests_total"] == 1
    assert delta["specmarket_tokens_generated_total"] == 5
    assert delta["specmarket_target_passes_total"] == 5
    assert delta["specmarket_target_positions_total"] > 5  # the prompt's prefill counts too
    assert delta["specmarket_draft_tokens_proposed_total"] == 0
    assert after["specmarket_active_jobs"] == 0
    assert after["specmarket_drafters_known"] == 0
    assert not any(k.startswith("specmarket_drafter_") for k in after)


def test_metrics_per_drafter_series(servers):
    samples, types, text = metrics(servers.url)
    assert samples["specmarket_drafters_known"] == 2
    assert samples['specmarket_drafter_proposed_tokens_total{peer="12D3KooWDrafterA"}'] == 12  # lifetime
    assert samples['specmarket_drafter_window_proposed_tokens{peer="12D3KooWDrafterA"}'] == 10  # resets at a bench
    assert samples['specmarket_drafter_accepted_tokens_total{peer="12D3KooWDrafterA"}'] == 6
    assert samples['specmarket_drafter_latency_seconds{peer="12D3KooWDrafterA"}'] == 0.0125  # base units
    assert samples['specmarket_drafter_consecutive_failures{peer="12D3KooWDrafterA"}'] == 1
    assert samples['specmarket_drafter_benched{peer="12D3KooWDrafterA"}'] == 1
    assert types["specmarket_drafter_timeouts_total"] == "counter"
    assert types["specmarket_drafter_latency_seconds"] == types["specmarket_drafter_consecutive_failures"] == "gauge"
    assert types["specmarket_drafter_benched"] == "gauge" and types["specmarket_drafter_benched_total"] == "counter"
    assert 'specmarket_drafter_window_proposed_tokens{peer="12D3KooWodd\\"peer\\\\x\\ny"} 3.0\n' in text  # escaped
    assert samples[f'specmarket_drafter_window_proposed_tokens{{peer="{ODD_PEER}"}}'] == 3  # read back as it was
    assert sum("latency_seconds{" in k for k in samples) == 1  # a None latency is no sample
    # Prometheus naming: _total only on counters, no gauge named like one
    counters = [name for name, kind in types.items() if kind == "counter" and not name.endswith("_created")]
    assert counters and all(name.endswith("_total") for name in counters)
    assert not [name for name, kind in types.items() if kind == "gauge" and name.endswith("_total")]


# --- bad requests -------------------------------------------------------------------------------

OK = {"prompt": PROMPT, "max_tokens": 2}
BAD_REQUESTS = [
    ({"max_tokens": 2}, 400, "prompt"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": [1, 2, 3]}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({**OK, "max_tokens": 0}, 400, "max_tokens"),
    ({**OK, "max_tokens": "5"}, 400, "max_tokens"),
    ({**OK, "max_tokens": True}, 400, "max_tokens"),
    ({**OK, "max_tokens": 5.0}, 400, "max_tokens"),
    ({**OK, "temperature": -1}, 400, "temperature"),
    ({**OK, "temperature": "hot"}, 400, "temperature"),
    ({**OK, "top_p": 0}, 400, "top_p"),
    ({**OK, "top_p": 1.5}, 400, "top_p"),
    ({**OK, "top_k": -3}, 400, "top_k"),
    ({**OK, "seed": -1}, 400, "seed"),
    ({**OK, "seed": True}, 400, "seed"),
    ({**OK, "seed": 1 << 70}, 400, "seed"),
    ({**OK, "stream": "yes"}, 400, "stream"),
    ({**OK, "n": 2}, 400, "n"),
    ({**OK, "best_of": 3}, 400, "best_of"),
    ({**OK, "logprobs": 2}, 400, "logprobs"),
    ({**OK, "echo": True}, 400, "echo"),
    ({**OK, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),  # OpenAI: at most 4
    ({**OK, "stop": "x" * 65}, 400, "stop"),  # a receipt commits to at most 64 bytes each
    ({**OK, "stop": 5}, 400, "stop"),
    ({**OK, "stop": ["\n", 5]}, 400, "stop[1]"),
    ({**OK, "suffix": "end"}, 400, "suffix"),
    ({**OK, "model": "gpt-4"}, 404, "model"),
    ({**OK, "model": 7}, 400, "model"),
    ({**OK, "max_tokens": 600}, 400, "context window"),
    ({**OK, "max_tokens": 600, "stream": True}, 400, "context window"),
    (b'{"prompt": "hi", "temperature": NaN}', 400, "NaN"),
    (b'{"prompt": "hi", "top_p": Infinity}', 400, "Infinity"),
    (b'{"prompt": "hi", "temperature": 1e999}', 400, "temperature"),
    (b'{"prompt": "hi", "max_tokens": ', 400, "JSON"),
    (b'{"prompt": "\\ud800 lone surrogate"}', 400, "prompt"),
    (b'[{"prompt": "hi"}]', 400, "object"),
    (b'"hi"', 400, "object"),
    (b"\xff\xfe", 400, "JSON"),
    (b"", 400, "JSON"),
]


@pytest.mark.parametrize(("body", "status", "named"), BAD_REQUESTS, ids=[str(b)[:60] for b, _, _ in BAD_REQUESTS])
def test_bad_request(servers, body, status, named):
    got, answer = post_json(servers.url, body)
    assert got == status, answer
    error = answer["error"]
    assert named in error["message"]
    assert error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}
    if isinstance(body, dict) and named in body:
        assert error["param"] == named
    if status == 404:
        assert error["code"] == "model_not_found"


def test_unknown_fields_and_a_charset_are_tolerated(servers):
    body = json.dumps({**OK, "user": "me", "stream_options": None, "x_custom": [1], "n": 1, "echo": False})
    declared = {"Content-Type": "application/json; charset=utf-8"}
    status, _, raw = request(servers.url, "POST", "/v1/completions", body.encode(), declared)
    assert status == 200 and len(json.loads(raw)["specmarket"]["tokens"]) == 2


CROSS_SITE_KINDS = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]


@pytest.mark.parametrize("kind", CROSS_SITE_KINDS)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_body_not_declared_json_is_refused_with_415_reverts(servers, path, kind):
    """What a page the operator visits could send cross-site without a CORS preflight starts no job."""
    before = servers.engine.counters.requests
    declared = {"Accept": "*/*"} if kind is None else {"Content-Type": kind}  # None: no Content-Type at all
    status, _, raw = request(servers.url, "POST", path, json.dumps(OK).encode(), declared)
    error = json.loads(raw)["error"]
    assert status == 415 and error["code"] == "unsupported_media_type" and "application/json" in error["message"]
    assert servers.engine.counters.requests == before


def test_prompt_as_single_item_list(servers, reference):
    status, body = post_json(servers.url, {"prompt": [PROMPT], "max_tokens": 3, "seed": 7})
    assert status == 200 and body["specmarket"]["tokens"] == reference(PROMPT, 7, 3)["tokens"]


def test_body_over_one_mib_is_413(servers):
    body = json.dumps({"prompt": "x" * (2 << 20)}).encode()
    status, answer = post_json(servers.url, body)
    assert status == 413 and "exceeds" in answer["error"]["message"]
    assert post_json(servers.url, OK)[0] == 200  # the server is still fine


def test_chunked_body_over_one_mib_is_413(servers):
    """Without a Content-Length the limit holds too: the body stops being kept once it passes 1 MiB."""

    def parts() -> Iterator[bytes]:
        yield b'{"prompt": "'
        yield from (b"x" * (64 << 10) for _ in range(40))
        yield b'"}'

    conn = http.client.HTTPConnection(urlsplit(servers.url).netloc, timeout=30)
    try:
        conn.request("POST", "/v1/completions", parts(), {"Content-Type": "application/json"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == "request_too_large"
    finally:
        conn.close()


def test_a_body_that_does_not_arrive_in_time_is_408(servers, monkeypatch):
    monkeypatch.setattr(http_api, "BODY_TIMEOUT_S", 0.5)
    with socket.create_connection(urlsplit(servers.url).netloc.split(":"), timeout=30) as sock:
        head = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        sock.sendall(head + b'{"prompt": ')  # and the rest never comes
        answer = sock.makefile("rb").read()
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.split()[1] == b"408" and b"did not arrive within 0.5 s" in rest


def test_wrong_method_and_unknown_path(servers):
    status, headers, raw = request(servers.url, "GET", "/v1/completions")
    assert status == 405 and headers["allow"] == "POST" and "POST" in json.loads(raw)["error"]["message"]
    status, headers, _ = request(servers.url, "DELETE", "/health")
    assert status == 405 and headers["allow"] == "GET"
    status, headers, raw = request(servers.url, "GET", "/v1/chat/completions")
    assert status == 405 and headers["allow"] == "POST" and json.loads(raw)["error"]["code"] == "method_not_allowed"
    status, _, raw = request(servers.url, "GET", "/v1/embeddings")
    assert status == 404 and json.loads(raw)["error"]["code"] == "not_found"


def test_openai_client_sees_the_error(servers):
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        sync_client(servers.url).completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        sync_client(servers.url).completions.create(model="nope", prompt=PROMPT, max_tokens=2)


def test_client_disconnect_cancels_the_job(servers):
    counters = servers.engine.counters
    before = counters.snapshot()
    conn = http.client.HTTPConnection(urlsplit(servers.url).netloc, timeout=30)
    body = json.dumps({"prompt": "Hello", "max_tokens": 500, "seed": 3, "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.fp.readline()  # the first chunk arrived: the job is running
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.monotonic() + 20
    while counters.snapshot()["active_jobs"] and time.monotonic() < deadline:
        time.sleep(0.02)
    after = counters.snapshot()
    assert after["active_jobs"] == 0, after
    assert after["requests_cancelled"] == before["requests_cancelled"] + 1, after  # cancelled, not run to 500 tokens
    assert after["requests_failed"] == before["requests_failed"]  # a client's going away is no failure
    assert after["tokens_generated"] == before["tokens_generated"]


# --- what an operator sees ----------------------------------------------------------------------


def test_error_answers_are_counted_by_code_and_logged_in_one_line(servers, caplog):
    """4xx answers used to be neither logged nor counted: an operator could not see a client's
    repeated mistakes, nor tell them from its own 5xx."""
    caplog.set_level(logging.INFO, logger="node.target.http.dashboard")
    before, _, _ = metrics(servers.url)
    assert post_json(servers.url, {"prompt": PROMPT, "max_tokens": 0})[0] == 400
    assert request(servers.url, "GET", "/no/such/route")[0] == 404
    after, types, _ = metrics(servers.url)
    code = 'specmarket_http_responses_total{{code="{}"}}'.format
    assert after[code(400)] == before.get(code(400), 0) + 1 and after[code(404)] == before.get(code(404), 0) + 1
    assert after[code(200)] >= before.get(code(200), 0) + 1  # the first /metrics answer
    assert types["specmarket_http_responses_total"] == "counter"
    lines = [r.getMessage() for r in caplog.records if r.name == "node.target.http.dashboard"]
    assert any(m.startswith("HTTP 400 for POST /v1/completions: 'max_tokens' must be") for m in lines), lines
    assert any(m.startswith("HTTP 404 for GET /no/such/route: no such route") for m in lines), lines
    assert all("\n" not in m for m in lines)


def test_a_streamed_answer_carries_the_job_id_of_the_logs(servers, caplog):
    """A stream's id (``cmpl-…``) used to differ from the ``job`` id of the node's log lines; the
    job's stats were logged as a Python dict."""
    caplog.set_level(logging.INFO, logger="node.target.engine")
    status, _, raw = request(
        servers.url, "POST", "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 3, "stream": True}).encode()
    )
    events = [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]
    assert status == 200 and len(events) >= 2
    ids = {e["id"] for e in events}
    assert len(ids) == 1 and next(iter(ids)).startswith("cmpl-")
    job = ids.pop().removeprefix("cmpl-")
    assert events[-1]["specmarket"]["job"] == job
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"job {job}: 3 tokens, ")]
    assert len(done) == 1 and "target_passes=" in done[0] and "{" not in done[0], done


def test_the_dashboard_json_reads_the_node_state_and_takes_no_writes(servers):
    status, body = post_json(servers.url, {"prompt": PROMPT, "max_tokens": 4, "seed": 11})
    assert status == 200
    code, _, raw = request(servers.url, "GET", "/api/dashboard")
    view = json.loads(raw)
    assert code == 200 and view["status"] == "ok" and view["model"] == MODEL
    assert view["jobs"][0]["job"] == body["id"].removeprefix("cmpl-") and view["jobs"][0]["tokens"] == 4
    assert view["jobs"][0]["speculative"] is False  # no drafters here: plain decoding
    assert view["drafters_total"] == 2 and view["drafters"]["12D3KooWDrafterA"]["proposed"] == 10
    assert view["counters"]["tokens_generated"] >= 4 and view["operator"] is None
    assert request(servers.url, "POST", "/api/dashboard", b"{}")[0] == 405


# --- node.client.http ----------------------------------------------------------------------------


def test_client_http_stream_completion(servers, reference, pair):
    deltas: list[str] = []
    result = stream_completion(
        servers.url, PROMPT, max_tokens=12, seed=7, temperature=1.0, top_p=1.0, on_text=deltas.append
    )
    check_full_answer(result["text"], result, reference(), pair)
    assert "".join(deltas) == result["text"] and len(deltas) > 1
    assert result["finish_reason"] == "length"


def test_client_http_reports_server_errors(servers):
    with pytest.raises(TargetHTTPError, match="HTTP 400: 'max_tokens' must be a positive integer") as info:
        stream_completion(servers.url, PROMPT, max_tokens=0, seed=1, temperature=1.0, top_p=1.0, on_text=print)
    assert info.value.status == 400
    with pytest.raises(TargetHTTPError, match="HTTP 404"):
        stream_completion(
            servers.url + "/nope", PROMPT, max_tokens=2, seed=1, temperature=1.0, top_p=1.0, on_text=print
        )


def test_client_http_connection_refused():
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TargetUnreachable, match=f"cannot reach the target at http://127.0.0.1:{port}.*refused"):
        stream_completion(
            f"http://127.0.0.1:{port}", PROMPT, max_tokens=2, seed=1, temperature=1.0, top_p=1.0, on_text=print
        )


def test_client_http_rejects_non_http_urls():
    with pytest.raises(ClientError, match="http://"):
        stream_completion("file:///etc/passwd", PROMPT, max_tokens=2, seed=1, temperature=1.0, top_p=1.0, on_text=print)


# --- stop sequences (OpenAI's `stop`) ---------------------------------------------------------


def test_a_stop_sequence_ends_the_answer_and_is_left_out_of_its_text(servers, reference, pair):
    """The answer is plain decoding's up to the token whose text completes the first stop sequence
    (a prefix of the answer without it), its text ends before the sequence, finish_reason is
    "stop", and the receipt-ready request names the sequence; streamed, the text is the same."""
    full = reference(n=24)
    text = full["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # two characters from the middle of the answer
    assert stop and stop in text
    client = sync_client(servers.url)
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, seed=7, stop=stop)
    ext = resp.model_extra["specmarket"]
    n = len(ext["tokens"])
    assert 0 < n < 24 and ext["tokens"] == full["tokens"][:n]
    assert stop in pair.tokenizer.decode(ext["tokens"]) and stop not in pair.tokenizer.decode(ext["tokens"][:-1])
    assert resp.choices[0].text == text[: text.find(stop)] and resp.choices[0].finish_reason == "stop"
    chunks = [c.to_dict() for c in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, seed=7,
                                                             stop=[stop, "never seen"], stream=True)]  # fmt: skip
    assert "".join(c["choices"][0]["text"] for c in chunks) == resp.choices[0].text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_stop_sequence_never_met_runs_to_max_tokens(servers, reference, pair):
    resp = sync_client(servers.url).completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, seed=7, stop=["\u2603\u2603", "never seen"]
    )
    check_full_answer(resp.choices[0].text, resp.model_extra["specmarket"], reference(), pair)
    assert resp.choices[0].finish_reason == "length"


def test_chat_accepts_stop(servers):
    body = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 8, "seed": 3, "stop": "e"}
    status, answer = post_json(servers.url, body, "/v1/chat/completions")
    assert status == 200 and "e" not in answer["choices"][0]["message"]["content"]
