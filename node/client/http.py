"""A small stdlib-only client for a target node's HTTP API (``specmarket ask --target http://...``).

It POSTs one streaming completion (``/v1/completions``, or ``/v1/chat/completions`` for a chat),
hands each text delta to a callback as it arrives, and returns the audit data of the final chunk.
Everything read from the server is bounded (line length, total size) and checked for shape;
failures are ``ClientError`` subclasses with a readable message.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from node.runtime.web import http_json
from p2p import safe_json
from verifier.errors import SpecmarketError

MAX_LINE_BYTES = 4 << 20  # the final chunk carries every token id (and the prompt's)
MAX_STREAM_BYTES = 64 << 20
MAX_ERROR_BYTES = 64 << 10
MAX_SHOWN_CHARS = 300  # of a non-JSON error body


class ClientError(SpecmarketError):
    """The target could not be asked, or answered something unusable."""


class TargetUnreachable(ClientError):
    """No HTTP answer at all: connection refused, DNS failure, timeout, reset."""


class TargetHTTPError(ClientError):
    """The target answered with an HTTP error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"target answered HTTP {status}: {message}")
        self.status = status
        self.server_message = message


class MalformedStream(ClientError):
    """The event stream broke the protocol: not SSE, bad JSON, too long, cut short."""


class TargetJobError(ClientError):
    """The target reported, inside the stream, that the job failed."""


def _error_message(raw: bytes) -> str:
    """The ``error.message`` of an OpenAI-shaped error body, else the start of the body."""
    try:
        message = safe_json.loads(raw, "an error body")["error"]["message"]
        if isinstance(message, str):
            return message
    except (ValueError, KeyError, TypeError):
        pass
    return raw[:MAX_SHOWN_CHARS].decode("utf-8", "replace").strip() or "(empty body)"


def _http_error(exc: urllib.error.HTTPError) -> TargetHTTPError:
    try:
        with exc:
            raw = exc.read(MAX_ERROR_BYTES)
    except (OSError, http.client.HTTPException):
        raw = b""
    return TargetHTTPError(exc.code, _error_message(raw))


def _lines(response: http.client.HTTPResponse) -> Iterator[str]:
    total = 0
    while True:
        line = response.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        total += len(line)
        if len(line) > MAX_LINE_BYTES:
            raise MalformedStream(f"an event-stream line exceeds {MAX_LINE_BYTES} bytes")
        if total > MAX_STREAM_BYTES:
            raise MalformedStream(f"the event stream exceeds {MAX_STREAM_BYTES} bytes")
        try:
            yield line.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise MalformedStream("the event stream is not UTF-8") from exc


def _events(response: http.client.HTTPResponse) -> Iterator[str]:
    """The data of each server-sent event (multi-line data joined with newlines)."""
    data: list[str] = []
    for line in _lines(response):
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        # comments (":...") and the event/id/retry fields carry nothing we use
    if data:
        yield "\n".join(data)


def _completion_text(choice: dict[str, Any]) -> Any:
    return choice.get("text")


def _chat_text(choice: dict[str, Any]) -> Any:
    delta = choice.get("delta")
    return delta.get("content") or "" if isinstance(delta, dict) else None


TextOf = Callable[[dict[str, Any]], Any]  # choices[0] of an event -> its text (a str, or the event is malformed)


def _parse_event(data: str, text_of: TextOf) -> dict[str, Any]:
    try:
        event = safe_json.loads(data, "an event")
    except ValueError as exc:
        raise MalformedStream(f"an event is not JSON: {data[:80]!r}") from exc
    if not isinstance(event, dict):
        raise MalformedStream("an event is not a JSON object")
    if "error" in event:
        error = event["error"]
        message = error.get("message") if isinstance(error, dict) else None
        raise TargetJobError(f"the target's job failed: {message if isinstance(message, str) else error!r}")
    choices = event.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedStream("an event has no choices")
    if not isinstance(text_of(choices[0]), str):
        raise MalformedStream("an event's choices[0] has no text")
    return event


def _read_stream(response: http.client.HTTPResponse, on_text: Callable[[str], None], text_of: TextOf) -> dict[str, Any]:
    content_type = response.headers.get("content-type", "")
    if not content_type.startswith("text/event-stream"):
        raise MalformedStream(f"expected a text/event-stream answer, got {content_type or 'no content type'!r}")
    parts: list[str] = []
    final: dict[str, Any] | None = None
    for data in _events(response):
        if data == "[DONE]":
            if final is None:
                raise MalformedStream("the stream ended without a final chunk (no finish_reason)")
            return final | {"text": "".join(parts)}
        event = _parse_event(data, text_of)
        choice = event["choices"][0]
        if text := text_of(choice):
            parts.append(text)
            on_text(text)
        if choice.get("finish_reason") is not None:
            extension = event.get("specmarket")
            if not isinstance(extension, dict):
                raise MalformedStream("the final chunk has no 'specmarket' object")
            final = {**extension, "finish_reason": choice["finish_reason"]}
    raise MalformedStream("the stream ended before 'data: [DONE]'")


def complete(http: str, prompt: str, *, seed: int, max_tokens: int, temperature: float = 1.0, **kw) -> dict:
    """One non-streaming completion from a target's OpenAI-compatible API at base URL ``http``."""
    body = {"prompt": prompt, "seed": seed, "max_tokens": max_tokens, "temperature": temperature, **kw}
    return http_json(f"{http}/v1/completions", body)


def chat_complete(
    http: str, messages: list[dict[str, str]], *, seed: int, max_tokens: int, temperature: float = 1.0, **kw
) -> dict:
    """One non-streaming chat completion (``/v1/chat/completions``): the answer ends at the end of
    the turn or after ``max_tokens``; the ``specmarket`` extension is the same as a completion's."""
    body = {"messages": messages, "seed": seed, "max_tokens": max_tokens, "temperature": temperature, **kw}
    return http_json(f"{http}/v1/chat/completions", body)


def _request(base_url: str, path: str, body: dict[str, Any]) -> urllib.request.Request:
    if not base_url.startswith(("http://", "https://")):
        raise ClientError(f"the target URL must start with http:// or https://, got {base_url!r}")
    return urllib.request.Request(
        base_url.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
        method="POST",
    )


def _stream(base_url: str, path: str, body: dict[str, Any], on_text, text_of: TextOf, timeout_s: float) -> dict:
    request = _request(base_url, path, body)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return _read_stream(response, on_text, text_of)
    except urllib.error.HTTPError as exc:
        raise _http_error(exc) from None
    except urllib.error.URLError as exc:
        raise TargetUnreachable(f"cannot reach the target at {base_url}: {exc.reason}") from exc
    except TimeoutError as exc:
        raise TargetUnreachable(f"the target at {base_url} did not answer within {timeout_s} s") from exc
    except (http.client.HTTPException, OSError) as exc:
        raise TargetUnreachable(f"the connection to {base_url} failed: {exc!r}") from exc


def _sampling(
    max_tokens: int, seed: int | None, temperature: float, top_p: float, top_k: int, ignore_eos: bool
) -> dict[str, Any]:
    """The request's sampling fields; the extensions (seed, top_k, ignore_eos) only where they are set."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "stream": True}
    extensions = {"seed": seed, "top_k": top_k or None, "ignore_eos": ignore_eos or None}
    return body | {name: value for name, value in extensions.items() if value is not None}


def stream_completion(
    base_url: str,
    prompt: str,
    *,
    max_tokens: int,
    seed: int | None,
    temperature: float,
    top_p: float,
    on_text: Callable[[str], None],
    top_k: int = 0,
    ignore_eos: bool = False,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Stream one completion from ``base_url``; ``on_text`` gets each text delta as it arrives.

    Returns the final chunk's ``specmarket`` object (job, tokens, prompt_tokens, seed, stats,
    credits, receipt) plus ``text`` (the whole completion) and ``finish_reason``. ``top_k`` 0 is
    off; ``ignore_eos`` runs to ``max_tokens`` past the end-of-sequence tokens. ``timeout_s`` bounds
    the connection and every wait for data.
    """
    body = {"prompt": prompt, **_sampling(max_tokens, seed, temperature, top_p, top_k, ignore_eos)}
    return _stream(base_url, "/v1/completions", body, on_text, _completion_text, timeout_s)


def stream_chat(
    base_url: str,
    messages: list[dict[str, str]],
    *,
    max_tokens: int,
    seed: int | None,
    temperature: float,
    top_p: float,
    on_text: Callable[[str], None],
    top_k: int = 0,
    ignore_eos: bool = False,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """As ``stream_completion``, for a chat: ``messages`` ({"role", "content"} each) go through the
    target model's chat template; ``prompt_tokens`` are the templated ids the receipt covers."""
    body = {"messages": messages, **_sampling(max_tokens, seed, temperature, top_p, top_k, ignore_eos)}
    return _stream(base_url, "/v1/chat/completions", body, on_text, _chat_text, timeout_s)
