"""The target node's OpenAI-compatible HTTP API: a FastAPI app served by hypercorn on trio.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (one JSON object, or server-sent
events with ``"stream": true``), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus,
``node.target.http.metrics``), ``GET /openapi.json``, and for people the dashboard ``GET /`` (which
polls ``GET /api/dashboard``) and ``GET /simulator`` (``node.target.http.pages``). Bodies and
answers are the pydantic models of ``node.target.http.schema``. Every error, a validation error
included, is answered in OpenAI's shape ``{"error": {...}}``: 400 for a bad body (not FastAPI's
422), 404, 405, 408, 413, 500, and 503 with ``Retry-After`` when ``max_jobs`` jobs run already. It
runs on trio (FastAPI and Starlette use anyio) because the target's libp2p host shares the event
loop.

Every stage of a connection has a deadline (``HttpLimits``): half-sent headers and idle keep-alive
connections (hypercorn's keep-alive timeout), the body (``read_body``), every write of a stream
(``JobResponse``) and, in the kernel, any response the client stops taking (``TCP_USER_TIMEOUT``).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import anyio
import trio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import Response
from hypercorn.config import Config, Sockets
from hypercorn.trio import serve
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from node.target.chat import chat_prompt
from node.target.config import HTTP_BODY_TIMEOUT_S, HttpLimits
from node.target.counters import JOB_HISTORY
from node.target.engine import Engine
from node.target.http.dashboard import ResponseLog, dashboard_view, node_condition
from node.target.http.jobs import JSON, JobResponse, error_response, json_response
from node.target.http.metrics import CONTENT_TYPE, MAX_LISTED_DRAFTERS, ApiMetrics, StatusFn
from node.target.http.pages import add_pages
from node.target.http.schema import (
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
from p2p import safe_json
from verifier.errors import SpecmarketError, sole_error

log = logging.getLogger(__name__)

BODY_TIMEOUT_S = HTTP_BODY_TIMEOUT_S  # a client must send its whole body this soon (unless HttpLimits say)
MAX_HEADER_BYTES = 16 << 10  # request line and headers (h11's limit; more is answered 431)
DRAIN_BYTES = 8 << 20  # an oversized body is read and dropped up to this size so the client gets its 413
GRACEFUL_SHUTDOWN_S = 2.0
JSON_MEDIA_TYPE = "application/json"  # the only body a POST takes (require_json)
Body = TypeVar("Body", bound=Sampling)


async def read_body(request: Request, timeout_s: float | None = None) -> bytes:
    """The body, at most MAX_BODY_BYTES, within ``timeout_s`` (None: BODY_TIMEOUT_S). A larger one is
    refused (413) and never kept: it is read and dropped (up to DRAIN_BYTES) so that the client can
    read the answer."""
    timeout_s = BODY_TIMEOUT_S if timeout_s is None else timeout_s
    declared = request.headers.get("content-length", "")
    declared_bytes = int(declared) if declared.isdigit() else 0
    over = declared_bytes > MAX_BODY_BYTES
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(timeout_s) as deadline:
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
        raise HttpError(408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout")
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


def require_json(request: Request) -> None:
    """A POST body must be declared JSON (415 otherwise, before it is read). A page the operator
    visits can send a cross-site form (text/plain, urlencoded, multipart) without a CORS preflight;
    an application/json body needs one, which this server never grants, so no page can start jobs."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != JSON_MEDIA_TYPE:
        shown = repr(media[:MAX_ECHOED_CHARS]) if media else "none"
        message = f"the request body must be {JSON_MEDIA_TYPE}, its Content-Type is {shown}"
        raise HttpError(415, message, code="unsupported_media_type")


async def parse_body(request: Request, model: type[Body], timeout_s: float | None = None) -> Body:
    """The body as ``model``: declared JSON, strict JSON, then strict validation (the first error, as a 400)."""
    require_json(request)
    data = parse_json_object(await read_body(request, timeout_s))
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None


_json, _error = json_response, error_response


class Routes:
    """The endpoints; ``status()`` adds the node's p2p view to /health and /metrics. ``limits`` None:
    the module's BODY_TIMEOUT_S and WRITE_TIMEOUT_S."""

    def __init__(self, engine: Engine, status: StatusFn, limits: HttpLimits | None = None) -> None:
        self.engine, self.status = engine, status
        self.metrics = ApiMetrics(engine, status)
        self.created = int(time.time())
        self.started = time.monotonic()
        self.body_timeout_s = limits.body_timeout_s if limits is not None else None
        self.write_timeout_s = limits.write_timeout_s if limits is not None else None

    def _job(self, body: Sampling, prompt: str | tuple[int, ...], wire: Wire) -> JobResponse:
        if body.model is not None and body.model != self.engine.model_name:
            shown, served = body.model[:MAX_ECHOED_CHARS], self.engine.model_name
            message = f"the model '{shown}' does not exist; this server serves '{served}'"
            raise HttpError(404, message, param="model", code="model_not_found")
        req = body.engine_request(prompt)
        return JobResponse(self.engine, req, wire, stream=body.stream, write_timeout_s=self.write_timeout_s)

    async def completions(self, request: Request) -> Response:
        body = await parse_body(request, CompletionBody, self.body_timeout_s)
        return self._job(body, body.prompt, TextWire())

    async def chat_completions(self, request: Request) -> Response:
        """The messages through the model's chat template; the receipt covers the templated ids. The
        answer ends at the end of the assistant's turn (the model's end-of-sequence tokens), as a
        completion does, unless ``ignore_eos``."""
        body = await parse_body(request, ChatBody, self.body_timeout_s)
        messages = [m.model_dump(include={"role", "content"}) for m in body.messages]
        return self._job(body, chat_prompt(self.engine.pair.tokenizer, messages), ChatWire())

    async def models(self) -> Response:
        known = self.engine.model_hash
        card = ModelCard(id=self.engine.model_name, created=self.created, model_hash=known and "0x" + known.hex())
        return _json(ModelList(data=[card]))

    async def health(self) -> Response:
        """200 with ``"status": "ok"`` while the node can serve and honour its receipts; 503 with
        ``"status": "unavailable"`` and the reason when it cannot (a bonded operator that is slashed,
        unbonding, unregistered, or whose chain does not answer: it refuses every completion)."""
        view = self.status()
        extra = {k: v for k, v in view.items() if k not in Health.model_fields}
        if isinstance(drafters := extra.get("drafters"), dict):  # bounded: peer ids are free to mint
            extra.setdefault("drafters_total", len(drafters))
            extra["drafters"] = dict(list(drafters.items())[:MAX_LISTED_DRAFTERS])
        active = self.engine.counters.snapshot()["active_jobs"]
        status, reason = node_condition(view)
        health = Health(status=status, reason=reason, model=self.engine.model_name, active_jobs=active, **extra)
        return _json(health, 200 if status == "ok" else 503)

    async def dashboard(self) -> Response:
        """What the dashboard page shows (``node.target.http.pages``): read-only, the node's own state."""
        return _json(dashboard_view(self.engine, self.status(), self.started))

    async def job_rounds(self, job: str) -> Response:
        """One remembered job's draft rounds: kind (early / answer / alone / probation), tokens drafted and
        accepted, and the round's wait, draft, transport and verification times in ms."""
        rounds = self.engine.history.rounds(job)
        if rounds is None:
            shown = job[:MAX_ECHOED_CHARS]
            raise HttpError(404, f"no finished job {shown!r} is remembered (the last {JOB_HISTORY})", code="not_found")
        return _json({"job": job, "rounds": rounds})

    async def metrics_text(self) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE)


ERRORS = {status: {"model": ErrorResponse} for status in (400, 404, 413, 415, 503)}


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
        return _error(err)  # logged with its message by ResponseLog

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error("unexpected error while serving %s %s", request.method, request.url.path, exc_info=exc)
        return _json(HttpError(500, "internal server error", code="internal_error").body(), 500)

    app.add_exception_handler(HTTPException, on_starlette)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(SpecmarketError, on_error)
    app.add_exception_handler(Exception, on_unexpected)


def build_app(engine: Engine, status: StatusFn | None = None, limits: HttpLimits | None = None) -> FastAPI:
    """The ASGI app serving ``engine``; ``status()`` returns the node's JSON-ready p2p view (or None: {});
    ``limits``: the body and write deadlines (serve_http takes the connection ones)."""
    routes = Routes(engine, status or dict, limits)
    app = FastAPI(title="specmarket target", version="1", docs_url=None, redoc_url=None)
    _post(app, "/v1/completions", routes.completions, CompletionBody, Completion, Completion)
    _post(app, "/v1/chat/completions", routes.chat_completions, ChatBody, ChatCompletion, ChatCompletionChunk)
    app.add_api_route("/v1/models", routes.models, methods=["GET"], response_model=ModelList)
    app.add_api_route("/health", routes.health, methods=["GET"], response_model=Health)
    app.add_api_route("/api/dashboard", routes.dashboard, methods=["GET"])
    app.add_api_route("/api/jobs/{job}/rounds", routes.job_rounds, methods=["GET"])
    add_pages(app)  # GET /, /simulator and /static/*: read-only pages for people
    text = {200: {"content": {CONTENT_TYPE.split(";")[0]: {}}, "description": "Prometheus text format 0.0.4"}}
    app.add_api_route("/metrics", routes.metrics_text, methods=["GET"], responses=text, response_class=Response)
    app.openapi = _openapi(app, (CompletionBody, ChatBody, ChatCompletionChunk))  # type: ignore[method-assign]
    _install_error_handlers(app)
    app.add_middleware(ResponseLog, metrics=routes.metrics)
    return app


class BoundedConfig(Config):
    """hypercorn's Config, whose listening sockets pass ``TCP_USER_TIMEOUT`` on to every connection:
    the kernel aborts a connection whose client has not taken sent data for that long (a zero window),
    and so ends a socket write that hypercorn shields from cancellation. Linux only; elsewhere a
    stalled stream still loses its job at the write deadline, but its connection waits for the client."""

    user_timeout_ms: int = 0

    def create_sockets(self) -> Sockets:
        sockets = super().create_sockets()
        option = getattr(socket, "TCP_USER_TIMEOUT", None)
        if self.user_timeout_ms and option is not None:
            for sock in sockets.insecure_sockets:
                sock.setsockopt(socket.IPPROTO_TCP, option, self.user_timeout_ms)
        return sockets


def http_config(host: str, port: int, limits: HttpLimits | None = None) -> Config:
    limits = limits or HttpLimits()
    config = BoundedConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = GRACEFUL_SHUTDOWN_S
    config.keep_alive_timeout = limits.idle_timeout_s  # also ends a connection whose headers never complete
    config.read_timeout = limits.read_timeout_s  # type: ignore[assignment]  # hypercorn: per read; a backstop
    config.h11_max_incomplete_size = MAX_HEADER_BYTES
    config.user_timeout_ms = round(limits.write_timeout_s * 1000)
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
    limits: HttpLimits | None = None,
) -> None:
    """Serve ``app`` on host:port (0 = any free port) until ``shutdown_trigger()`` returns."""
    config = http_config(host, port, limits)
    try:
        await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=_FirstBind(task_status), mode="asgi")
    except BaseExceptionGroup as group:  # hypercorn's nurseries wrap a failed bind
        if isinstance(error := sole_error(group), OSError):
            raise error from None
        raise
