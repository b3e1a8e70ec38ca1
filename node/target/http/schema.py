"""The OpenAI-compatible wire format as pydantic models, and the project's error shape. No I/O here.

Nothing that arrives over HTTP is trusted. A body, parsed as strict JSON by ``api.parse_body``
(no NaN or Infinity), is validated in pydantic's strict mode (a JSON ``true`` is not an integer,
``"5"`` is not a number), with the size bounds below. Value ranges (temperature, top_p, top_k, seed,
max_tokens >= 1) are left to ``CompletionRequest``, which checks the libp2p protocol's requests too.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from node.target.chat import ROLES
from node.target.counters import Overloaded
from node.target.engine import MAX_PROMPT_CHARS, CompletionRequest, CompletionResult
from p2p.messages import MAX_NEW_TOKENS
from verifier.errors import ContextTooLong, InvalidParams, SpecmarketError, Unavailable, error_leaves

MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_TOKENS = 16
MAX_CHAT_MESSAGES = 128
MAX_ECHOED_CHARS = 64  # client-supplied strings quoted back in error messages are cut to this
REQUEST_FIELDS = ("prompt", "messages", "max_tokens", "seed", "temperature", "top_k", "top_p", "ignore_eos", "stop")
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
# their messages name the field
OWN_ERRORS = ("unsupported", "prompt_shape", "invalid_text", "chat_too_long", "stop_shape")
EMPTY_HINTS = {  # what an empty field should hold, said plainly
    "prompt": "send the text to continue",
    "messages": "send at least one message",
}
NEUTRAL: dict[str, tuple[Any, ...]] = {  # OpenAI fields this server cannot honour: accepted only as these
    "n": (1,),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "logprobs": (False,),
    "top_logprobs": (),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
}


class HttpError(SpecmarketError):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s  # sent as Retry-After (503: the server is at capacity)

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


# --- requests ------------------------------------------------------------------------------------


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


def _valid_text(value: str, info: ValidationInfo) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from "\ud800" escapes
        message = "'{name}' is not valid Unicode text"
        raise PydanticCustomError("invalid_text", message, {"name": info.field_name}) from None
    return value


def _one_prompt(value: Any) -> Any:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        return value[0]
    if isinstance(value, list):
        raise PydanticCustomError(
            "prompt_shape",
            "'prompt' must be a string or a list of exactly one string, got an array "
            "(token-id and batched prompts are not supported)",
        )
    return value


def _stop_list(value: Any) -> Any:
    """OpenAI's ``stop``: one string, or a list of strings."""
    if isinstance(value, str):
        return [value]
    if value is not None and not isinstance(value, list):
        raise PydanticCustomError("stop_shape", "'stop' must be a string or a list of strings")
    return value


Text = Annotated[str, AfterValidator(_valid_text)]
Prompt = Annotated[Text, BeforeValidator(_one_prompt), Field(min_length=1, max_length=MAX_PROMPT_CHARS)]


class Sampling(BaseModel):
    """The fields /v1/completions and /v1/chat/completions share."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    model: str | None = Field(None, description="must name the served model when given")
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, le=MAX_NEW_TOKENS, description="tokens to generate, >= 1")
    ignore_eos: bool = Field(False, description="run to max_tokens past end-of-sequence (an extension, as in vLLM)")
    temperature: float = Field(1.0, description="0 = greedy, at most 100")
    top_p: float = Field(1.0, description="nucleus mass in (0, 1]; 1 = off")
    top_k: int = Field(0, description="0 = off (an extension, as in vLLM)")
    seed: int | None = Field(None, description="in [0, 2^64); none: the server draws one and reports it")
    stream: bool = False
    stream_options: dict[str, bool] | None = Field(None, description="accepted; the final chunk always has usage")
    user: str | None = Field(None, max_length=MAX_ECHOED_CHARS * 4)
    n: Any = None  # the NEUTRAL fields (sampling and logprob options this server does not have)
    best_of: Any = None
    echo: Any = None
    suffix: Any = None
    stop: Annotated[list[Text] | None, BeforeValidator(_stop_list)] = Field(
        None, description="up to 4 stop sequences: the answer ends at the first, which its text leaves out"
    )
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: Any = None

    @field_validator(*NEUTRAL)
    @classmethod
    def _neutral(cls, value: Any, info: ValidationInfo) -> Any:
        allowed = NEUTRAL[str(info.field_name)]
        if value is None or any(type(value) is type(a) and value == a for a in allowed):
            return value
        shown = " or ".join(json.dumps(a) for a in allowed) or "null"
        message = "'{name}' is not supported by this server (only {shown})"
        raise PydanticCustomError("unsupported", message, {"name": info.field_name, "shown": shown})

    def engine_request(self, prompt: str | tuple[int, ...]) -> CompletionRequest:
        """The engine's request; a value out of range is a 400 naming its field."""
        try:
            stop = tuple(s for s in self.stop or () if s)  # OpenAI ignores an empty stop string ("stop": "")
            return CompletionRequest(
                prompt, self.max_tokens, self.temperature, self.top_p, self.top_k, self.seed, self.ignore_eos, stop
            )
        except InvalidParams as exc:
            raise HttpError(400, str(exc), param=_named_field(str(exc)), code="invalid_value") from exc


class CompletionBody(Sampling):
    """``POST /v1/completions``. Unknown fields are ignored, as OpenAI clients send many. With no
    ``max_tokens`` an answer has at most 16 tokens, OpenAI's default for legacy completions."""

    prompt: Prompt

    @field_validator("max_tokens")
    @classmethod
    def _openai_default(cls, value: int | None) -> int:
        return DEFAULT_MAX_TOKENS if value is None else value


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    role: Literal[ROLES]  # type: ignore[valid-type]
    content: Annotated[Text, Field(max_length=MAX_PROMPT_CHARS)]
    name: str | None = Field(None, max_length=MAX_ECHOED_CHARS, description="accepted and ignored")


class ChatBody(Sampling):
    """``POST /v1/chat/completions``: the messages go through the model's chat template
    (``node.target.chat``). Unknown fields are refused; the OpenAI fields listed are accepted."""

    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_CHAT_MESSAGES)
    # none: the answer runs to the end of the assistant's turn, bounded by the context window (OpenAI's chat)
    max_tokens: int | None = Field(None, le=MAX_NEW_TOKENS, description="tokens to generate, >= 1; none: to the end")
    max_completion_tokens: int | None = Field(None, le=MAX_NEW_TOKENS, description="the newer name of max_tokens")

    @field_validator("messages")
    @classmethod
    def _bounded(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        total = sum(len(m.content) for m in messages)
        if total > MAX_PROMPT_CHARS:
            message = "'messages' hold {total} characters; the limit is {limit}"
            raise PydanticCustomError("chat_too_long", message, {"total": total, "limit": MAX_PROMPT_CHARS})
        return messages

    @model_validator(mode="after")
    def _newer_name(self) -> ChatBody:
        if self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return self


def _named_field(message: str) -> str | None:
    """The request field an engine validation message is about (they all start by naming it)."""
    found = [(message.find(name), name) for name in REQUEST_FIELDS if name in message]
    return min(found)[1] if found else None


def _where(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: ("messages", 0, "role") -> "messages[0].role"."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def validation_error(errors: Sequence[Mapping[str, Any]]) -> HttpError:
    """The 400 for a body that failed validation (pydantic's error list): its first error, naming the field."""
    error = errors[0]
    loc = tuple(p for p in error["loc"] if p != "body")
    param = _where(loc) or None
    kind = error["type"]
    if kind in OWN_ERRORS:
        message, code = error["msg"], "unsupported" if kind == "unsupported" else "invalid_value"
    elif kind == "missing":
        message, code = f"'{param}' is required", "missing_required_parameter"
    elif kind == "extra_forbidden":
        message, code = f"'{param}' is not a field of this request", "unknown_field"
    elif kind in ("too_short", "string_too_short") and error.get("ctx", {}).get("actual_length") == 0:
        message, code = f"'{param}' is empty: {EMPTY_HINTS.get(str(param), 'give it a value')}", "invalid_value"
    else:
        got = f", got {json_type(error.get('input'))}" if kind.endswith("_type") else ""
        message, code = f"'{param}': {error['msg']}{got}", "invalid_value"
    return HttpError(400, message, param=param, code=code)


def http_error_for(exc: BaseException) -> HttpError | None:
    """The answer to a failed request (trio wraps errors in ExceptionGroups); None for an unexpected error."""
    known = [e for e in error_leaves(exc) if isinstance(e, SpecmarketError)]
    if not known:
        return None
    err = known[0]
    if isinstance(err, HttpError):
        return err
    if isinstance(err, InvalidParams):
        return HttpError(400, str(err), param=_named_field(str(err)), code="invalid_value")
    if isinstance(err, ContextTooLong):
        return HttpError(400, str(err), param="max_tokens", code="context_length_exceeded")
    if isinstance(err, Overloaded):
        return HttpError(503, str(err), code="server_overloaded", retry_after_s=err.retry_after_s)
    if isinstance(err, Unavailable):
        return HttpError(503, str(err), code=type(err).__name__)
    return HttpError(500, str(err) or type(err).__name__, code=type(err).__name__)


# --- responses -----------------------------------------------------------------------------------

FinishReason = Literal["length", "stop"]


class ErrorDetail(BaseModel):
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Extension(BaseModel):
    """The ``specmarket`` object: everything needed to audit the answer (``prompt_tokens`` are the
    ids the target conditioned on, for a chat the templated ones; ``receipt`` is null when unbonded)."""

    job: str
    tokens: list[int]
    prompt_tokens: list[int]
    seed: int
    stats: dict[str, float | int]
    credits: dict[str, int]  # drafter peer id -> its draft tokens that were accepted
    receipt: dict[str, Any] | None


class ChunkExtension(BaseModel):
    tokens: list[int]  # the token ids of this chunk


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Answer(BaseModel):
    """What every object of one answer shares; the last stream chunk has usage and the full
    ``specmarket`` object, the other chunks ``{"tokens": [...]}``."""

    id: str
    created: int
    model: str
    usage: Usage | None = None
    specmarket: Extension | ChunkExtension | None = None


class TextChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: FinishReason | None


class Completion(Answer):
    object: Literal["text_completion"] = "text_completion"
    choices: list[TextChoice]


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatMessageOut
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletion(Answer):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class Delta(BaseModel):
    """The first chunk's delta has the role, the later ones content; unset fields are left out."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _without_nulls(self, handler: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: None = None
    finish_reason: FinishReason | None


class ChatCompletionChunk(Answer):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]


class ModelCard(BaseModel):
    """The served model: ``id`` is its directory's name, ``model_hash`` the commitment receipts
    name (sha256 over its files, ``node.model.loading.model_hash``; null when not computed)."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specmarket"
    model_hash: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    """``status`` (and why, when not ok), ``model`` and ``active_jobs``, plus the node's view (peer
    id, drafters, and the operator: bond, active, unbonding, chain reachability, receipts signed)."""

    model_config = ConfigDict(extra="allow")

    status: Literal["ok", "unavailable"] = "ok"
    reason: str = ""  # why the node cannot serve ("" when ok)
    model: str
    active_jobs: int


# --- the objects of both APIs --------------------------------------------------------------------


def audit_data(result: CompletionResult) -> dict[str, Any]:
    """``usage`` and the full ``specmarket`` object of a finished job."""
    prompt, completion = len(result.prompt_tokens), len(result.tokens)
    usage = Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
    return {"usage": usage, "specmarket": Extension.model_validate(result, from_attributes=True)}


class TextWire:
    """``/v1/completions``: ``text_completion`` objects, streamed or not."""

    id_prefix = "cmpl-"

    def answer(self, head: dict[str, Any], result: CompletionResult) -> Completion:
        choice = TextChoice(text=result.text, finish_reason=result.finish_reason)
        return Completion(**head, choices=[choice], **audit_data(result))

    def chunks(self, head: dict[str, Any], text: str, tokens: tuple[int, ...], first: bool) -> list[BaseModel]:
        choice = TextChoice(text=text, finish_reason=None)
        return [Completion(**head, choices=[choice], specmarket=ChunkExtension(tokens=list(tokens)))]

    def final(self, head: dict[str, Any], result: CompletionResult) -> Completion:
        choice = TextChoice(text="", finish_reason=result.finish_reason)
        return Completion(**head, choices=[choice], **audit_data(result))


class ChatWire:
    """``/v1/chat/completions``: a ``chat.completion``, or ``chat.completion.chunk`` objects."""

    id_prefix = "chatcmpl-"

    def answer(self, head: dict[str, Any], result: CompletionResult) -> ChatCompletion:
        choice = ChatChoice(message=ChatMessageOut(content=result.text), finish_reason=result.finish_reason)
        return ChatCompletion(**head, choices=[choice], **audit_data(result))

    def chunks(self, head: dict[str, Any], text: str, tokens: tuple[int, ...], first: bool) -> list[BaseModel]:
        """The first verified chunk is preceded by the one that gives the role."""
        role = ChatChunkChoice(delta=Delta(role="assistant", content=""), finish_reason=None)
        opening = [ChatCompletionChunk(**head, choices=[role])] if first else []
        choice = ChatChunkChoice(delta=Delta(content=text), finish_reason=None)
        return [*opening, ChatCompletionChunk(**head, choices=[choice], specmarket=ChunkExtension(tokens=list(tokens)))]

    def final(self, head: dict[str, Any], result: CompletionResult) -> ChatCompletionChunk:
        choice = ChatChunkChoice(delta=Delta(), finish_reason=result.finish_reason)
        return ChatCompletionChunk(**head, choices=[choice], **audit_data(result))


Wire = TextWire | ChatWire
