"""The target node's OpenAI-compatible HTTP API: a FastAPI app served by hypercorn on trio.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (one JSON object, or server-sent
events with ``"stream": true``), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus,
``node.target.http_metrics``) and ``GET /openapi.json``. Bodies and answers are the pydantic models
of ``node.target.http_schema``. Every error, a validation error included, is answered in OpenAI's
shape ``{"error": {...}}``: 400 for a bad body (not FastAPI's 422), 404, 405, 408, 413, 500. It runs
on trio (FastAPI and Starlette use anyio) because the target's libp2p host shares the event loop.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import anyio
import trio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from hypercorn.config import Config
from hypercorn.trio import serve
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from node import safe_json
from node.target.chat import chat_prompt
from node.target.engine import CompletionRequest, CompletionResult, Engine
from node.target.http_metrics import CONTENT_TYPE, ApiMetrics, StatusFn
from node.target.http_schema import (
    MAX_BODY_BYTES,
    MAX_ECHOED_CHARS,
    ChatBody,
    ChatCompletion,
    ChatCompletionChunk,
    ChatWire,
    Completion,
    CompletionBody,
    ErrorResponse,
    Health,
    HttpError,
    ModelCard,
    ModelList,
    Sampling,
    TextWire,
    Wire,
    http_error_for,
    json_type,
    validation_error,
)
from verifier.errors import SpecmarketError, sole_error

log = logging.getLogger(__name__)

BODY_TIMEOUT_S = 10.0  # a client must send its whole body this soon
DRAIN_BYTES = 8 << 20  # an oversized body is read and dropped up to this size so the client gets its 413
GRACEFUL_SHUTDOWN_S = 2.0
JSON = "application/json"
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
Body = TypeVar("Body", bound=Sampling)


class ClientGone(SpecmarketError):
    """The client disconnected before its response was complete."""


async def read_body(request: Request) -> bytes:
    """The body, at most MAX_BODY_BYTES, within BODY_TIMEOUT_S. A larger one is refused (413) and
    never kept: it is read and dropped (up to DRAIN_BYTES) so that the client can read the answer."""
    declared = request.headers.get("content-length", "")
    declared_bytes = int(declared) if declared.isdigit() else 0
    over = declared_bytes > MAX_BODY_BYTES
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(BODY_TIMEOUT_S) as deadline:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                over = over or size > MAX_BODY_BYTES
                if over and max(size, declared_bytes) > DRAIN_BYTES:  # too much to wait for: answer now
                    break
                if not over:
                    chunks.append(chunk)
        except ClientDisconnect:
            raise HttpError(400, "the client went away while sending the body", code="client_gone") from None
    if over:
        raise HttpError(413, f"the request body exceeds {MAX_BODY_BYTES} bytes", code="request_too_large")
    if deadline.cancelled_caught:
        raise HttpError(408, f"the request body did not arrive within {BODY_TIMEOUT_S:g} s", code="request_timeout")
    return b"".join(chunks)


def _reject_constant(name: str) -> NoReturn:
    raise HttpError(400, f"{name} is not a valid JSON number", code="invalid_json")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; anything else is a 400."""
    try:
        data = safe_json.loads(raw.decode("utf-8"), "the request body", parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise HttpError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise HttpError(400, f"the request body must be a JSON object, got {json_type(data)}", code="invalid_json")
    return data


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The body as ``model``: strict JSON, then strict validation (the first error, as a 400)."""
    data = parse_json_object(await read_body(request))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None


def _dumps(obj: BaseModel | dict[str, Any]) -> str:
    return obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj, ensure_ascii=False)


def _json(obj: BaseModel | dict[str, Any], status: int = 200) -> Response:
    return Response(_dumps(obj), status, media_type=JSON)


class JobResponse(Response):
    """Runs one job when it is sent: one JSON object at the end, or (stream) an event per verified
    chunk, a final event with usage and the audit data, then ``data: [DONE]``.

    The 200 goes out with the first chunk, so an error found before any token (a prompt too long for
    the context window) still gets its status code; a later one is sent as an error event. The
    client's disconnect cancels the job.
    """

    def __init__(self, engine: Engine, req: CompletionRequest, wire: Wire, *, stream: bool) -> None:
        super().__init__(media_type=JSON)
        self.engine, self.req, self.wire, self.stream = engine, req, wire, stream
        self.started = self.gone = False
        self._send: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._send = send
        head = {"id": self.wire.id_prefix + secrets.token_hex(8), "model": self.engine.model_name}
        head["created"] = int(time.time())
        try:
            result = await self._watched(receive, self._chunker(head) if self.stream else None)
        except ClientGone:
            log.debug("client went away during job")
            return
        except SpecmarketError as exc:
            err = http_error_for(exc) or HttpError(500, "internal server error", code="internal_error")
            if not self.started:
                await _json(err.body(), err.status)(scope, receive, send)
                return
            await self._event(err.body(), more=False)
            return
        if not self.stream:
            head["id"] = self.wire.id_prefix + result.job
            await _json(self.wire.answer(head, result))(scope, receive, send)
            return
        await self._event(self.wire.final(head, result))
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def _watched(self, receive: Receive, on_chunk) -> CompletionResult:
        result: CompletionResult | None = None
        error: SpecmarketError | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch_disconnect, receive, tasks.cancel_scope)
            try:
                result = await self.engine.complete(self.req, on_chunk)
            except SpecmarketError as exc:  # re-raised below, outside the task group's exception group
                error = exc
            tasks.cancel_scope.cancel()
        if self.gone:
            raise ClientGone
        if error is not None:
            raise error
        assert result is not None
        return result

    async def _watch_disconnect(self, receive: Receive, scope: anyio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        scope.cancel()

    def _chunker(self, head: dict[str, Any]) -> Callable[[tuple[int, ...], str], Awaitable[None]]:
        async def on_chunk(tokens: tuple[int, ...], text: str) -> None:
            for event in self.wire.chunks(head, text, tokens, first=not self.started):
                await self._event(event)

        return on_chunk

    async def _event(self, obj: BaseModel | dict[str, Any], *, more: bool = True) -> None:
        assert self._send is not None
        if not self.started:
            self.started = True
            await self._send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await self._send({"type": "http.response.body", "body": f"data: {_dumps(obj)}\n\n".encode(), "more_body": more})


class Routes:
    """The endpoints; ``status()`` adds the node's p2p view to /health and /metrics."""

    def __init__(self, engine: Engine, status: StatusFn) -> None:
        self.engine, self.status = engine, status
        self.metrics = ApiMetrics(engine, status)
        self.created = int(time.time())

    def _job(
        self, body: Sampling, prompt: str | tuple[int, ...], wire: Wire, *, stop_at_eos: bool = False
    ) -> JobResponse:
        if body.model is not None and body.model != self.engine.model_name:
            shown, served = body.model[:MAX_ECHOED_CHARS], self.engine.model_name
            message = f"the model '{shown}' does not exist; this server serves '{served}'"
            raise HttpError(404, message, param="model", code="model_not_found")
        return JobResponse(self.engine, body.engine_request(prompt, stop_at_eos=stop_at_eos), wire, stream=body.stream)

    async def completions(self, request: Request) -> Response:
        body = await parse_body(request, CompletionBody)
        return self._job(body, body.prompt, TextWire())

    async def chat_completions(self, request: Request) -> Response:
        """The messages through the model's chat template; the receipt covers the templated ids. The
        answer ends at the end of the assistant's turn (the tokenizer's end-of-sequence token)."""
        body = await parse_body(request, ChatBody)
        messages = [m.model_dump(include={"role", "content"}) for m in body.messages]
        return self._job(body, chat_prompt(self.engine.pair.tokenizer, messages), ChatWire(), stop_at_eos=True)

    async def models(self) -> Response:
        return _json(ModelList(data=[ModelCard(id=self.engine.model_name, created=self.created)]))

    async def health(self) -> Response:
        extra = {k: v for k, v in self.status().items() if k not in Health.model_fields}
        active = self.engine.counters.snapshot()["active_jobs"]
        return _json(Health(model=self.engine.model_name, active_jobs=active, **extra))

    async def metrics_text(self) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)


ERRORS = {400: {"model": ErrorResponse}, 404: {"model": ErrorResponse}, 413: {"model": ErrorResponse}}


def _post(
    app: FastAPI, path: str, endpoint, body: type[BaseModel], answer: type[BaseModel], chunk: type[BaseModel]
) -> None:
    """A POST route whose body is parsed by ``parse_body`` (so FastAPI is told its schema here)."""
    ref = "#/components/schemas/{}".format
    request_body = {"requestBody": {"required": True, "content": {JSON: {"schema": {"$ref": ref(body.__name__)}}}}}
    events = {"text/event-stream": {"schema": {"$ref": ref(chunk.__name__)}}}
    responses = {**ERRORS, 200: {"content": events, "description": "one JSON object, or events with stream"}}
    app.add_api_route(
        path, endpoint, methods=["POST"], response_model=answer, responses=responses, openapi_extra=request_body
    )


def _openapi(app: FastAPI, bodies: tuple[type[BaseModel], ...]) -> Callable[[], dict[str, Any]]:
    """FastAPI's schema plus the models it does not see: the request bodies and the stream chunks."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            models = [(m, "validation") for m in bodies]
            _, defs = models_json_schema(models, ref_template="#/components/schemas/{model}")
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def _install_error_handlers(app: FastAPI) -> None:
    async def on_starlette(request: Request, exc: HTTPException) -> Response:
        path, method = request.url.path, request.method
        if exc.status_code == 404:
            err = HttpError(404, f"no such route: {path[:MAX_ECHOED_CHARS]!r}", code="not_found")
        elif exc.status_code == 405:
            allowed = (exc.headers or {}).get("Allow", "")
            err = HttpError(405, f"{path} accepts {allowed}, not {method}", code="method_not_allowed")
        else:
            err = HttpError(exc.status_code, str(exc.detail))
        response = _json(err.body(), err.status)
        response.headers.update(exc.headers or {})
        return response

    async def on_invalid(request: Request, exc: RequestValidationError) -> Response:
        err = validation_error(list(exc.errors()))
        return _json(err.body(), err.status)

    async def on_error(request: Request, exc: SpecmarketError) -> Response:  # HttpError included
        err = http_error_for(exc) or HttpError(500, "internal server error", code="internal_error")
        if err.status >= 500:
            log.warning("request failed: %s", err.message)
        return _json(err.body(), err.status)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error while serving %s %s", request.method, request.url.path, exc_info=exc)
        return _json(HttpError(500, "internal server error", code="internal_error").body(), 500)

    app.add_exception_handler(HTTPException, on_starlette)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(SpecmarketError, on_error)
    app.add_exception_handler(Exception, on_unexpected)


def build_app(engine: Engine, status: StatusFn | None = None) -> FastAPI:
    """The ASGI app serving ``engine``; ``status()`` returns the node's JSON-ready p2p view (or None: {})."""
    routes = Routes(engine, status or dict)
    app = FastAPI(title="specmarket target", version="1", docs_url=None, redoc_url=None)
    _post(app, "/v1/completions", routes.completions, CompletionBody, Completion, Completion)
    _post(app, "/v1/chat/completions", routes.chat_completions, ChatBody, ChatCompletion, ChatCompletionChunk)
    app.add_api_route("/v1/models", routes.models, methods=["GET"], response_model=ModelList)
    app.add_api_route("/health", routes.health, methods=["GET"], response_model=Health)
    text = {200: {"content": {CONTENT_TYPE.split(";")[0]: {}}, "description": "Prometheus text format 0.0.4"}}
    app.add_api_route("/metrics", routes.metrics_text, methods=["GET"], responses=text, response_class=Response)
    app.openapi = _openapi(app, (CompletionBody, ChatBody, ChatCompletionChunk))  # type: ignore[method-assign]
    _install_error_handlers(app)
    return app


def http_config(host: str, port: int) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
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
    app: FastAPI,
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
