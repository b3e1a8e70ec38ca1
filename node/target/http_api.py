"""The target node's OpenAI-compatible HTTP API: a hand-written ASGI app served by hypercorn on trio.

Routes: ``POST /v1/completions`` (plain JSON or a server-sent-event stream), ``GET /v1/models``,
``GET /health`` and ``GET /metrics`` (Prometheus text). Parsing and response shapes live in
``node.target.http_schema``; this module does the I/O: bounded body reading, routing, streaming, and
cancelling a job whose client went away. It runs on trio because the target's libp2p host shares
the event loop.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from node.target.engine import CompletionRequest, CompletionResult, Engine
from node.target.http_schema import (
    MAX_BODY_BYTES,
    HttpError,
    chunk_object,
    completion_object,
    final_chunk_object,
    http_error_for,
    models_object,
    parse_completion,
    parse_json_object,
    render_metrics,
)
from verifier.errors import SpecmarketError, sole_error

log = logging.getLogger(__name__)

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
StatusFn = Callable[[], dict[str, Any]]
App = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
METRICS_HEADERS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
DRAIN_BYTES = 8 << 20  # an oversized body is read and dropped up to this size so the client gets its 413
DRAIN_SECONDS = 5.0
GRACEFUL_SHUTDOWN_S = 2.0


class ClientGone(SpecmarketError):
    """The client disconnected before its response was complete."""


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str).encode()


def _finite(obj: Any) -> Any:
    """A copy of a status() value that strict JSON can carry (NaN/inf become null, keys strings)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _answer(exc: BaseException) -> HttpError:
    """The error response for a failed request; unexpected errors are logged and not detailed."""
    err = http_error_for(exc)
    if err is None:
        log.error("unexpected error while serving a request", exc_info=exc)
        return HttpError(500, "internal server error", code="internal_error")
    if err.status >= 500:
        log.warning("request failed: %s", err.message)
    return err


class Exchange:
    """One HTTP request and its response, over ASGI."""

    def __init__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self._send = send
        self.status: int | None = None  # set once the response has started
        self.gone = False  # the client disconnected

    @property
    def started(self) -> bool:
        return self.status is not None

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def write(self, data: bytes, *, more: bool) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(self, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        await self.start(status, [*headers, (b"content-length", str(len(body)).encode())])
        await self.write(body, more=False)

    async def json(self, status: int, obj: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await self.respond(status, dumps(obj), JSON_HEADERS + (headers or []))

    def _declared_length(self) -> int | None:
        for name, value in self.scope.get("headers", []):
            if name.lower() == b"content-length":
                return int(value) if value.strip().isdigit() else None
        return None

    async def _next(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.gone = True
            raise ClientGone
        return message

    async def read_body(self) -> bytes:
        """The whole body, at most MAX_BODY_BYTES; a larger one stops being kept at once (413)."""
        declared = self._declared_length()
        if declared is not None and declared > MAX_BODY_BYTES:
            await self._drain(0, more=True, declared=declared)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._next()
            body, more = message.get("body", b""), message.get("more_body", False)
            size += len(body)
            if size > MAX_BODY_BYTES:
                await self._drain(size, more=more, declared=declared)
            chunks.append(body)
            if not more:
                return b"".join(chunks)

    async def _drain(self, received: int, *, more: bool, declared: int | None) -> NoReturn:
        """Drop the rest of an oversized body (bounded) so the client can read its 413, then raise it."""
        if declared is None or declared <= DRAIN_BYTES:
            with trio.move_on_after(DRAIN_SECONDS):
                while more and received <= DRAIN_BYTES:
                    message = await self._next()
                    received += len(message.get("body", b""))
                    more = message.get("more_body", False)
        raise HttpError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _watch_disconnect(ex: Exchange, scope: trio.CancelScope) -> None:
    while True:
        message = await ex.receive()
        if message["type"] == "http.disconnect":
            ex.gone = True
            scope.cancel()
            return


async def _watched(ex: Exchange, job: Callable[[], Awaitable[CompletionResult]]) -> CompletionResult:
    """Run a job (after the body was read); the client's disconnect cancels it (ClientGone)."""
    result: CompletionResult | None = None
    error: Exception | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_disconnect, ex, nursery.cancel_scope)
        try:
            result = await job()
        except Exception as exc:  # re-raised below, outside the nursery's exception group
            error = exc
        nursery.cancel_scope.cancel()
    if ex.gone:
        raise ClientGone
    if error is not None:
        raise error
    assert result is not None
    return result


class HttpApi:
    """The ASGI application; ``status()`` adds the node's p2p view to /health and /metrics."""

    def __init__(self, engine: Engine, status: StatusFn | None = None) -> None:
        self.engine = engine
        self.status = status or dict
        self.created = int(time.time())
        self.routes: dict[str, dict[str, Callable[[Exchange], Awaitable[None]]]] = {
            "/v1/completions": {"POST": self.completions},
            "/v1/models": {"GET": self.models},
            "/health": {"GET": self.health},
            "/metrics": {"GET": self.metrics},
        }

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        ex = Exchange(scope, receive, send)
        started = time.perf_counter()
        try:
            await self._dispatch(ex)
        except ClientGone:
            log.debug("client went away: %s %s", scope["method"], scope["path"])
        except Exception as exc:
            await self._fail(ex, exc)
        wall = time.perf_counter() - started
        log.debug("%s %s -> %s in %.3f s", scope["method"], scope["path"], ex.status or "-", wall)

    async def _dispatch(self, ex: Exchange) -> None:
        path, method = ex.scope["path"], ex.scope["method"]
        methods = self.routes.get(path)
        if methods is None:
            raise HttpError(404, f"no such route: {path[:64]!r}", code="not_found")
        handler = methods.get(method)
        if handler is None:
            allowed = ", ".join(methods)
            err = HttpError(405, f"{path} accepts {allowed}, not {method}", code="method_not_allowed")
            await ex.json(405, err.body(), [(b"allow", allowed.encode())])
            return
        await handler(ex)

    async def _fail(self, ex: Exchange, exc: Exception) -> None:
        err = _answer(exc)
        if ex.started:  # too late for a status code; the stream handler reports its own errors
            log.warning("error after the response started: %s", err.message)
            return
        await ex.json(err.status, err.body())

    def _status(self) -> dict[str, Any]:
        try:
            extra = self.status()
        except Exception:
            log.exception("status() failed")
            return {}
        return _finite(extra) if isinstance(extra, dict) else {}

    async def completions(self, ex: Exchange) -> None:
        body = parse_json_object(await ex.read_body())
        req, stream = parse_completion(body, self.engine.model_name)
        if stream:
            await self._stream(ex, req)
            return
        result = await _watched(ex, functools.partial(self.engine.complete, req))
        await ex.json(200, completion_object(result, self.engine.model_name, int(time.time())))

    async def _stream(self, ex: Exchange, req: CompletionRequest) -> None:
        """SSE: a chunk per verified chunk, a final chunk with the audit data, then [DONE].

        The 200 header goes out with the first chunk, so errors found before any token (a prompt too
        long for the context window) still get a proper status code.
        """
        cid, model, created = f"cmpl-{secrets.token_hex(8)}", self.engine.model_name, int(time.time())

        async def on_chunk(tokens: tuple[int, ...], text: str) -> None:
            await self._event(ex, chunk_object(cid, model, created, text, tokens))

        try:
            result = await _watched(ex, functools.partial(self.engine.complete, req, on_chunk))
        except ClientGone:
            raise
        except Exception as exc:
            if not ex.started:
                raise
            await self._event(ex, _answer(exc).body(), more=False)
            return
        await self._event(ex, final_chunk_object(cid, model, created, result))
        await ex.write(b"data: [DONE]\n\n", more=False)

    async def _event(self, ex: Exchange, obj: Any, *, more: bool = True) -> None:
        if not ex.started:
            await ex.start(200, SSE_HEADERS)
        await ex.write(b"data: " + dumps(obj) + b"\n\n", more=more)

    async def models(self, ex: Exchange) -> None:
        await ex.json(200, models_object(self.engine.model_name, self.created))

    async def health(self, ex: Exchange) -> None:
        body: dict[str, Any] = {
            "status": "ok",
            "model": self.engine.model_name,
            "active_jobs": self.engine.counters.snapshot()["active_jobs"],
        }
        body.update((k, v) for k, v in self._status().items() if k not in body)
        await ex.json(200, body)

    async def metrics(self, ex: Exchange) -> None:
        drafters = self._status().get("drafters")
        text = render_metrics(self.engine.counters.snapshot(), drafters if isinstance(drafters, dict) else {})
        await ex.respond(200, text.encode(), METRICS_HEADERS)


def build_app(engine: Engine, status: StatusFn | None = None) -> App:
    """The ASGI app serving ``engine``; ``status()`` returns the node's JSON-ready p2p view (or None: {})."""
    return HttpApi(engine, status)


def http_config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None  # requests are logged at DEBUG by the app itself
    config.errorlog = log
    config.graceful_timeout = GRACEFUL_SHUTDOWN_S
    return config


class _FirstBind:
    """Adapts hypercorn's ``started(binds)`` to ours, ``started("http://HOST:PORT")``."""

    def __init__(self, outer: trio.TaskStatus[str]) -> None:
        self.outer = outer

    def started(self, binds: list[str]) -> None:
        self.outer.started(binds[0])


async def serve_http(
    app: App,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
    shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Serve ``app`` on host:port (0 = any free port) until ``shutdown_trigger()`` returns."""
    config = http_config(host, port)
    try:
        await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=_FirstBind(task_status), mode="asgi")
    except BaseExceptionGroup as group:  # hypercorn's nurseries wrap a failed bind
        if isinstance(error := sole_error(group), OSError):
            raise error from None
        raise
