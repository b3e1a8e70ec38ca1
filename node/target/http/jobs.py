"""One completion job as an ASGI response (``node.target.http.api``'s POST routes): a JSON answer, or
server-sent events under a write deadline per event."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.types import Message, Receive, Scope, Send

from node.target.config import HTTP_WRITE_TIMEOUT_S
from node.target.counters import ClientGone, new_job_id
from node.target.engine import CompletionRequest, CompletionResult, Engine
from node.target.http.schema import HttpError, Wire, http_error_for
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

JSON = "application/json"
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
WRITE_TIMEOUT_S = HTTP_WRITE_TIMEOUT_S  # a stream's client must take each event this soon (unless told)


class ClientStalled(ClientGone):
    """The client took no data within the write deadline: its job is cancelled."""


def dumps(obj: BaseModel | dict[str, Any]) -> str:
    return obj.model_dump_json() if isinstance(obj, BaseModel) else json.dumps(obj, ensure_ascii=False)


def json_response(
    obj: BaseModel | dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(dumps(obj), status, headers=headers, media_type=JSON)


def error_response(err: HttpError) -> Response:
    return json_response(err.body(), err.status, err.headers())


class JobResponse(Response):
    """Runs one job when it is sent: one JSON object at the end, or (stream) an event per verified
    chunk, a final event with usage and the audit data, then ``data: [DONE]``.

    The 200 goes out with the first chunk, so an error found before any token (a prompt too long for
    the context window, a full engine) still gets its status code; a later one is sent as an error
    event. The client's disconnect cancels the job. A stream's events go to one writer task, each
    handed over within ``write_timeout_s``: a client that does not take a chunk in time (it stopped
    reading) has its job cancelled, which closes its drafter sessions and frees its job slot; the
    kernel then drops the connection (``TCP_USER_TIMEOUT``, ``http_config``), since hypercorn's
    socket writes cannot be cancelled.
    """

    def __init__(
        self, engine: Engine, req: CompletionRequest, wire: Wire, *, stream: bool, write_timeout_s: float | None = None
    ) -> None:
        super().__init__(media_type=JSON)
        self.engine, self.req, self.wire, self.stream = engine, req, wire, stream
        self.write_timeout_s = WRITE_TIMEOUT_S if write_timeout_s is None else write_timeout_s
        self.started = self.gone = False
        self.job_id = ""
        self._send: Send | None = None
        self._events: MemoryObjectSendStream[Message] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._send = send
        self.job_id = new_job_id()  # the id of the job's log lines, its answer and every event
        head = {"id": self.wire.id_prefix + self.job_id, "model": self.engine.model_name}
        head["created"] = int(time.time())
        if not self.stream:
            await self._respond(scope, receive, head)
            return
        events, pending = anyio.create_memory_object_stream[Message](0)  # unbuffered: a hand-over per event
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._write, pending)
            async with events:
                self._events = events
                await self._respond(scope, receive, head)

    async def _respond(self, scope: Scope, receive: Receive, head: dict[str, Any]) -> None:
        assert self._send is not None
        try:
            result = await self._watched(receive, self._chunker(head) if self.stream else None)
            if not self.stream:
                await json_response(self.wire.answer(head, result))(scope, receive, self._send)
                return
            await self._event(self.wire.final(head, result))
            await self._put({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        except ClientStalled as exc:
            log.info("job %s cancelled: %s", self.job_id, exc)
        except ClientGone:
            log.info("job %s cancelled: the client went away", self.job_id)
        except SpecmarketError as exc:
            err = http_error_for(exc) or HttpError(500, "internal server error", code="internal_error")
            if not self.started:
                await error_response(err)(scope, receive, self._send)
                return
            with contextlib.suppress(ClientGone):
                await self._event(err.body(), more=False)

    async def _watched(self, receive: Receive, on_chunk) -> CompletionResult:
        result: CompletionResult | None = None
        error: SpecmarketError | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch_disconnect, receive, tasks.cancel_scope)
            try:
                result = await self.engine.complete(self.req, on_chunk, self.job_id)
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
        if not self.started:
            self.started = True
            await self._put({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await self._put({"type": "http.response.body", "body": f"data: {dumps(obj)}\n\n".encode(), "more_body": more})

    async def _put(self, message: Message) -> None:
        """Hand ``message`` to the writer; ClientStalled when it is still busy with the last one."""
        assert self._events is not None
        with anyio.move_on_after(self.write_timeout_s) as deadline:
            await self._events.send(message)
        if deadline.cancelled_caught:
            raise ClientStalled(f"the client took no data for {self.write_timeout_s:g} s")

    async def _write(self, pending: MemoryObjectReceiveStream[Message]) -> None:
        assert self._send is not None
        async with pending:
            async for message in pending:
                await self._send(message)
