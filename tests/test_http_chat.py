"""``POST /v1/chat/completions``, ``/openapi.json`` and the latency histograms, end to end: the shipped
tiny models behind a real Engine and real hypercorn, asked with the official ``openai`` client.

The drafting engine drafts in-process with the shipped draft model (a real model, no network), so
draft rounds happen and the draft-wait histogram has something to count; every answer is compared
token for token with plain decoding of the templated prompt.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import openai
import pytest
import trio
from chainutil import new_operator

from node.chain.audit import audit_answer
from node.chain.receipts import SignedReceipt
from node.cli import main
from node.client.ask import AskConfig, check_receipt
from node.model.loading import TINY_TARGET, model_hash
from node.target.chat import FALLBACK_CHAT_TEMPLATE, chat_prompt
from node.target.engine import CompletionRequest, Engine
from node.target.http.api import build_app
from node.target.http.schema import MAX_CHAT_MESSAGES
from tests.httputil import MODEL, async_client, metrics, post_json, request, serving, sync_client
from verifier.decode import decode
from verifier.errors import InvalidParams
from verifier.params import SamplingParams
from verifier.proposers import LocalDraftProposer

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def parse(text):"}]
HISTOGRAMS = (
    "specmarket_time_to_first_token_seconds",
    "specmarket_inter_token_latency_seconds",
    "specmarket_draft_wait_seconds",
)


class LocalJob:
    """One job's proposer: the shipped draft model with its own KV cache (``JobProposer``)."""

    def __init__(self, pair) -> None:
        self.proposer = LocalDraftProposer(pair.draft.fork())
        self.name = "local-draft"

    def propose(self, context: Sequence[int], **kwargs) -> object:
        return self.proposer.propose(context, **kwargs)

    def finish(self, context: Sequence[int]) -> dict[str, int]:
        return {}

    def timing(self) -> dict[str, float | int]:
        return {}


@dataclass(frozen=True)
class LocalDrafting:
    """A ``DraftingBackend`` that drafts every job in-process."""

    pair: object

    @asynccontextmanager
    async def job(
        self, job_id: str, params: SamplingParams, seed: int, gamma: int, max_tokens: int
    ) -> AsyncIterator[LocalJob]:
        yield LocalJob(self.pair)


@pytest.fixture(scope="module")
def url(pair) -> Iterator[str]:
    engine = Engine(pair, model_name=MODEL, gamma=4, drafting=LocalDrafting(pair))
    with serving({"main": build_app(engine)}) as urls:
        yield urls["main"]


def reference(pair, messages: list[dict], seed: int, n: int, temperature: float = 1.0) -> tuple[list[int], list[int]]:
    """(templated prompt ids, plain decoding's tokens) for a chat."""
    prompt = list(chat_prompt(pair.tokenizer, messages))
    params = SamplingParams(temperature=temperature)
    result = decode(pair.target.fork(), None, prompt, params=params, seed=seed, max_new_tokens=n)
    return prompt, list(result.tokens)


# --- the chat template -----------------------------------------------------------------------------


def test_a_tokenizer_without_a_template_gets_the_documented_fallback(pair):
    tok = pair.tokenizer
    assert not tok.chat_template
    expected = [
        tok.eos_token_id,
        *tok.encode("<|system|>\nYou write Python.\n<|user|>\ndef parse(text):\n<|assistant|>\n"),
    ]
    assert list(chat_prompt(tok, MESSAGES)) == expected
    assert FALLBACK_CHAT_TEMPLATE.startswith("{{ eos_token }}")


def test_a_tokenizer_with_a_template_uses_its_own(pair):
    tok = copy.deepcopy(pair.tokenizer)
    tok.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}[go]"
    assert list(chat_prompt(tok, MESSAGES)) == tok.encode("[system]You write Python.[user]def parse(text):[go]")
    tok.chat_template = "{{ raise_exception('system messages are not supported') }}"
    with pytest.raises(InvalidParams, match="system messages are not supported"):
        chat_prompt(tok, MESSAGES)


def test_the_engine_takes_token_prompts_as_they_are(pair):
    ids = chat_prompt(pair.tokenizer, MESSAGES)
    engine = Engine(pair, model_name=MODEL, gamma=4)
    result = trio.run(engine.complete, CompletionRequest(ids, 5, seed=2))
    assert result.prompt_tokens == ids and list(result.tokens) == reference(pair, MESSAGES, 2, 5)[1]
    for bad in ((), (1, True), (1, -2)):
        with pytest.raises(InvalidParams, match="token prompt"):
            CompletionRequest(bad, 4)
    with pytest.raises(InvalidParams, match="outside the vocabulary"):
        trio.run(engine.complete, CompletionRequest((1, pair.target.vocab_size), 4))


# --- the official openai client --------------------------------------------------------------------


def check_answer(text: str, ext: dict, pair, seed: int = 7, n: int = 12) -> None:
    prompt, tokens = reference(pair, MESSAGES, seed, n)
    assert ext["prompt_tokens"] == prompt  # the engine conditioned on the templated ids
    assert ext["tokens"] == tokens and ext["seed"] == seed
    assert text == pair.tokenizer.decode(tokens)
    assert ext["stats"]["draft_tokens_proposed"] > 0  # the local drafter was asked
    assert ext["receipt"] is None  # this engine is not bonded


def check_stream(chunks: list, pair) -> str:
    """The chunks of a streamed chat: role first, then content, finish_reason last; returns the text."""
    first, *body, final = chunks
    assert first.choices[0].delta.role == "assistant" and not first.choices[0].delta.content
    assert all(c.choices[0].finish_reason is None and c.choices[0].delta.role is None for c in body)
    assert final.choices[0].finish_reason == "length" and not final.choices[0].delta.content
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    assert final.usage.completion_tokens == 12
    ext = final.model_extra["specmarket"]
    assert [t for c in body for t in c.model_extra["specmarket"]["tokens"]] == ext["tokens"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    check_answer(text, ext, pair)
    return text


def test_openai_sync_chat_stream_equals_create(url, pair):
    client = sync_client(url)
    resp = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=7, temperature=1.0)
    assert resp.object == "chat.completion" and resp.model == MODEL
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].finish_reason == "length"
    ext = resp.model_extra["specmarket"]
    assert resp.id == "chatcmpl-" + ext["job"]
    check_answer(resp.choices[0].message.content, ext, pair)
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (len(ext["prompt_tokens"]), 12)
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=7, stream=True)
    assert check_stream(list(stream), pair) == resp.choices[0].message.content


@pytest.mark.asyncio
async def test_openai_async_chat_stream_equals_create(url, pair):
    async with async_client(url) as client:
        resp = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=7)
        stream = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, seed=7, stream=True
        )
        chunks = [chunk async for chunk in stream]
    check_answer(resp.choices[0].message.content, resp.to_dict()["specmarket"], pair)
    assert check_stream(chunks, pair) == resp.choices[0].message.content


def test_raw_chat_answer_has_openai_shape(url, pair):
    status, body = post_json(url, {"messages": MESSAGES, "max_tokens": 3, "seed": 1}, "/v1/chat/completions")
    assert status == 200
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "specmarket"}
    assert body["choices"][0]["message"]["role"] == "assistant" and body["choices"][0]["logprobs"] is None
    assert set(body["specmarket"]) == {"job", "tokens", "prompt_tokens", "seed", "stats", "credits", "receipt"}
    raw = json.dumps({"messages": MESSAGES, "max_tokens": 3, "seed": 1, "stream": True}).encode()
    status, headers, data = request(url, "POST", "/v1/chat/completions", raw)
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: ") :] for line in data.decode().split("\n\n") if line]
    assert events[-1] == "[DONE]" and json.loads(events[0])["choices"][0]["delta"] == {
        "role": "assistant",
        "content": "",
    }
    assert "role" not in json.loads(events[1])["choices"][0]["delta"]  # later deltas carry content only


# --- bad requests ----------------------------------------------------------------------------------

USER = [{"role": "user", "content": "hi"}]
BAD_CHATS = [
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"messages": USER * (MAX_CHAT_MESSAGES + 1)}, "messages"),
    ({"messages": [{"role": "user", "content": "x" * 20_000}] * 2}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "hi", "color": "red"}]}, "messages[0].color"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": "hi"}, "messages"),
    ({"max_tokens": 2}, "messages"),
    ({"messages": USER, "temperature": 101}, "temperature"),
    ({"messages": USER, "temperature": -0.5}, "temperature"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "top_p": 0}, "top_p"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_tokens": 5000}, "max_tokens"),
    ({"messages": USER, "max_tokens": 600}, "max_tokens", "context window"),
    ({"messages": USER, "seed": True}, "seed"),
    ({"messages": USER, "tools": []}, "tools"),  # an unknown field
    ({"messages": USER, "n": 2}, "n"),
    ({"messages": USER, "logprobs": True}, "logprobs"),
]


@pytest.mark.parametrize("case", BAD_CHATS, ids=[f"{case[1]}-{i}" for i, case in enumerate(BAD_CHATS)])
def test_bad_chat_request(url, case):
    body, param, *named = case
    status, answer = post_json(url, body, "/v1/chat/completions")
    assert status == 400, answer
    error = answer["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param and (named or [param.split("[")[0]])[0] in error["message"]


def test_chat_errors_reach_the_openai_client(url):
    client = sync_client(url)
    with pytest.raises(openai.BadRequestError, match="role"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "wizard", "content": "hi"}], max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, temperature=250.0)
    with pytest.raises(openai.BadRequestError, match="unknown_thing"):
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, extra_body={"unknown_thing": 1})
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=2)


# --- OpenAPI and metrics ---------------------------------------------------------------------------


def test_openapi_lists_every_route_and_its_bodies(url):
    status, _, raw = request(url, "GET", "/openapi.json")
    schema = json.loads(raw)
    assert status == 200 and schema["openapi"].startswith("3.")
    routes = {path: set(ops) for path, ops in schema["paths"].items()}
    assert routes == {
        "/v1/completions": {"post"},
        "/v1/chat/completions": {"post"},
        "/v1/models": {"get"},
        "/health": {"get"},
        "/metrics": {"get"},
        "/api/dashboard": {"get"},  # read-only; the HTML pages are not API routes
        "/api/jobs/{job}/rounds": {"get"},
    }
    components = schema["components"]["schemas"]
    for path, body in (("/v1/completions", "CompletionBody"), ("/v1/chat/completions", "ChatBody")):
        ref = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{body}" and body in components
    chat = components["ChatBody"]
    assert chat["additionalProperties"] is False and chat["properties"]["messages"]["maxItems"] == MAX_CHAT_MESSAGES
    assert components["ChatMessage"]["properties"]["role"]["enum"] == ["system", "user", "assistant"]
    assert {"Completion", "ChatCompletion", "ErrorResponse", "Health", "ModelList"} <= set(components)


def test_metrics_have_the_latency_histograms(url):
    before, types, _ = metrics(url)
    status, body = post_json(url, {"messages": USER, "max_tokens": 8, "seed": 3}, "/v1/chat/completions")
    assert status == 200
    after, _, _ = metrics(url)
    for name in HISTOGRAMS:
        assert types[f"{name}_bucket"] == "histogram"
        assert after[f"{name}_count"] > before[f"{name}_count"], name
        assert after[f"{name}_sum"] > 0 and after[f'{name}_bucket{{le="+Inf"}}'] == after[f"{name}_count"]
    assert (
        after["specmarket_time_to_first_token_seconds_count"] - before["specmarket_time_to_first_token_seconds_count"]
        == 1
    )  # one job, one first token
    rounds = body["specmarket"]["stats"]["draft_tokens_proposed"] > 0
    assert rounds and after["specmarket_tokens_generated_total"] - before["specmarket_tokens_generated_total"] == 8


# --- receipts ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bonded_url(pair, chain, tmp_path_factory) -> Iterator[str]:
    operator, _ = new_operator(chain, tmp_path_factory.mktemp("chat-operator"), model_hash(TINY_TARGET))
    engine = Engine(pair, model_name=MODEL, gamma=4, operator=operator)
    with serving({"bonded": build_app(engine)}) as urls:
        yield urls["bonded"]
    operator.close()


def test_a_chat_receipt_covers_the_templated_prompt(bonded_url, pair, chain, tmp_path):
    resp = sync_client(bonded_url).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=10, seed=4)
    ext = resp.model_extra["specmarket"]
    saved = tmp_path / "receipt.json"
    asked = AskConfig(
        MESSAGES[1]["content"],
        bonded_url,
        seed=4,
        max_new_tokens=10,
        receipt_out=saved,
        chat=True,
        system=MESSAGES[0]["content"],
        pair="tiny",
        rpc=chain.rpc,
        deployments=chain.deployments,
    )
    # signature, hashes, the tokens received, the request made (templated here), the operator on chain
    assert "receipt signed by operator" in check_receipt(ext, asked)
    signed = SignedReceipt.from_json(json.loads(saved.read_text()))
    templated, tokens = reference(pair, MESSAGES, 4, 10)
    assert list(signed.request.prompt) == templated == ext["prompt_tokens"]
    assert list(signed.output) == tokens == ext["tokens"]
    assert audit_answer(pair.target.fork(), signed).first_wrong is None  # a challenger finds it honest


def test_ask_chat_cli_over_http(bonded_url, pair, chain, tmp_path, capsys):
    checks = ["--pair", "tiny", *chain.cli_args()]  # what the receipt is checked against
    args = ["ask", "--target", bonded_url, *checks, "--chat", "--system", MESSAGES[0]["content"], "--seed", "5"]
    assert (
        main([*args, "--max-new-tokens", "6", "--receipt-out", str(tmp_path / "r.json"), MESSAGES[1]["content"]]) == 0
    )
    out = capsys.readouterr()
    templated, tokens = reference(pair, MESSAGES, 5, 6)
    assert out.out.rstrip("\n") == pair.tokenizer.decode(tokens) and "receipt signed by operator" in out.err
    assert list(SignedReceipt.from_json(json.loads((tmp_path / "r.json").read_text())).request.prompt) == templated
    short = ["--chat", "--json", "--seed", "5", "--max-new-tokens", "3", "hi"]
    assert main(["ask", "--target", bonded_url, *checks, *short]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["prompt_tokens"] == list(chat_prompt(pair.tokenizer, USER)) and len(summary["tokens"]) == 3
    config = tmp_path / "ask.toml"  # the config file's [ask] table, under the command line
    config.write_text(f'[ask]\nchat = true\nsystem = "{MESSAGES[0]["content"]}"\nmax-new-tokens = 6\nseed = 9\n')
    from_file = ["--config", str(config), "--seed", "5", "--json", "def parse(text):"]
    assert main(["ask", "--target", bonded_url, *checks, *from_file]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == tokens  # chat, system and length from the file


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWA", "--chat"], "--chat needs an http:// target"),
        (["--target", "http://127.0.0.1:1", "--system", "be brief"], "--system needs --chat"),
    ],
)
def test_ask_chat_options_are_checked(args, message, capsys):
    assert main(["ask", *args, "hi"]) == 2
    assert message in capsys.readouterr().err
