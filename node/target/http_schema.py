"""The OpenAI-compatible wire format: request parsing, response objects, Prometheus text. No I/O here.

Nothing that arrives over HTTP is trusted: every field is type-checked here (a JSON ``true`` is not
an integer, NaN/Infinity are not numbers) before ``CompletionRequest`` checks the ranges.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, NoReturn

from node.target.engine import CompletionRequest, CompletionResult
from verifier.errors import ContextTooLong, InvalidParams, SpecmarketError, error_leaves

MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_TOKENS = 16
MAX_ECHOED_CHARS = 64  # client-supplied strings quoted back in error messages are cut to this
REQUEST_FIELDS = ("prompt", "max_tokens", "seed", "temperature", "top_k", "top_p")
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
GAUGE_SUFFIXES = ("_ms", "_seconds", "_rate", "_ratio", "_score")
ENGINE_METRICS = (  # (EngineCounters field, metric name, type, help)
    ("requests", "requests_total", "counter", "Completion jobs started."),
    ("requests_failed", "requests_failed_total", "counter", "Completion jobs that failed or were cancelled."),
    ("tokens_generated", "tokens_generated_total", "counter", "Verified tokens generated."),
    ("target_passes", "target_passes_total", "counter", "Target model forward passes."),
    ("target_positions", "target_positions_total", "counter", "Positions scored by the target (prefill included)."),
    ("draft_tokens_proposed", "draft_tokens_proposed_total", "counter", "Draft tokens proposed by drafters."),
    ("draft_tokens_accepted", "draft_tokens_accepted_total", "counter", "Draft tokens accepted by verification."),
    ("active_jobs", "active_jobs", "gauge", "Completion jobs running now."),
)


class HttpError(SpecmarketError):
    """An error answered in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _json_type(value: Any) -> str:
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


def _reject_constant(name: str) -> NoReturn:
    raise HttpError(400, f"{name} is not a valid JSON number", code="invalid_json")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; anything else is a 400."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise HttpError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise HttpError(400, f"the request body must be a JSON object, got {_json_type(data)}", code="invalid_json")
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


# OpenAI fields this server cannot honour: (accepted when the value is its default, hint)
UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: v is None or (_is_int(v) and v == 1), "only n=1"),
    "best_of": (lambda v: v is None or (_is_int(v) and v == 1), "only best_of=1"),
    "logprobs": (lambda v: v is None, "logprobs are not returned"),
    "echo": (lambda v: v is None or v is False, "only echo=false"),
    "suffix": (lambda v: v is None or v == "", "insertion is not supported"),
    "stop": (lambda v: v is None or v == [], "stop sequences are not supported"),
    "presence_penalty": (lambda v: v is None or (_is_number(v) and v == 0), "only 0"),
    "frequency_penalty": (lambda v: v is None or (_is_number(v) and v == 0), "only 0"),
    "logit_bias": (lambda v: v is None or v == {}, "only an empty logit_bias"),
}


def _check_unsupported(body: dict[str, Any]) -> None:
    for name, (accepted, hint) in UNSUPPORTED.items():
        if name in body and not accepted(body[name]):
            raise HttpError(400, f"'{name}' is not supported by this server ({hint})", param=name, code="unsupported")


def _check_model(body: dict[str, Any], model_name: str) -> None:
    model = body.get("model")
    if model is None:
        return
    if not isinstance(model, str):
        raise HttpError(400, f"'model' must be a string, got {_json_type(model)}", param="model")
    if model != model_name:
        shown = model[:MAX_ECHOED_CHARS]
        raise HttpError(
            404,
            f"the model '{shown}' does not exist; this server serves '{model_name}'",
            param="model",
            code="model_not_found",
        )


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if prompt is None:
        raise HttpError(400, "'prompt' is required", param="prompt", code="missing_required_parameter")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise HttpError(
            400,
            f"'prompt' must be a string or a list of exactly one string, got {_json_type(prompt)} "
            "(token-id and batched prompts are not supported)",
            param="prompt",
        )
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates from "\ud800" escapes
        raise HttpError(400, "'prompt' is not valid Unicode text", param="prompt") from exc
    return prompt


def _field(body: dict[str, Any], name: str, default: Any, check: Callable[[Any], bool], kind: str) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not check(value):
        raise HttpError(400, f"'{name}' must be {kind}, got {_json_type(value)}", param=name)
    return value


def _number(body: dict[str, Any], name: str, default: float) -> float:
    value = _field(body, name, default, lambda v: _is_int(v) or isinstance(v, float), "a number")
    try:
        number = float(value)
    except OverflowError as exc:
        raise HttpError(400, f"'{name}' is out of range", param=name) from exc
    if not math.isfinite(number):
        raise HttpError(400, f"'{name}' must be a finite number", param=name)
    return number


def parse_completion(body: dict[str, Any], model_name: str) -> tuple[CompletionRequest, bool]:
    """(the engine request, stream?) from a ``/v1/completions`` body; unknown fields are ignored."""
    _check_unsupported(body)
    _check_model(body, model_name)
    prompt = _prompt(body)
    stream = _field(body, "stream", False, lambda v: isinstance(v, bool), "a boolean")
    try:
        req = CompletionRequest(
            prompt=prompt,
            max_tokens=_field(body, "max_tokens", DEFAULT_MAX_TOKENS, _is_int, "an integer"),
            temperature=_number(body, "temperature", 1.0),
            top_p=_number(body, "top_p", 1.0),
            top_k=_field(body, "top_k", 0, _is_int, "an integer"),
            seed=_field(body, "seed", None, _is_int, "an integer"),
        )
    except InvalidParams as exc:
        raise HttpError(400, str(exc), param=_named_field(str(exc)), code="invalid_value") from exc
    return req, stream


def _named_field(message: str) -> str | None:
    """The request field an engine validation message is about (they all start by naming it)."""
    found = [(message.find(name), name) for name in REQUEST_FIELDS if name in message]
    return min(found)[1] if found else None


def http_error_for(exc: BaseException) -> HttpError | None:
    """The answer to a failed job (trio wraps errors in ExceptionGroups); None for an unexpected error."""
    leaves = error_leaves(exc)
    known = [e for e in leaves if isinstance(e, SpecmarketError)]
    if not known:
        return None
    err = known[0]
    if isinstance(err, HttpError):
        return err
    if isinstance(err, InvalidParams):
        return HttpError(400, str(err), param=_named_field(str(err)), code="invalid_value")
    if isinstance(err, ContextTooLong):
        return HttpError(400, str(err), param="max_tokens", code="context_length_exceeded")
    return HttpError(500, str(err) or type(err).__name__, code=type(err).__name__)


def extension(result: CompletionResult) -> dict[str, Any]:
    """The ``specmarket`` object: everything needed to audit the answer."""
    return {
        "job": result.job,
        "tokens": list(result.tokens),
        "prompt_tokens": list(result.prompt_tokens),
        "seed": result.seed,
        "stats": dict(result.stats),
        "credits": dict(result.credits),
        "receipt": result.receipt,  # the operator's signed receipt (null when the node is not bonded)
    }


def _usage(result: CompletionResult) -> dict[str, int]:
    prompt, completion = len(result.prompt_tokens), len(result.tokens)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _envelope(cid: str, model: str, created: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}
    return {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def completion_object(result: CompletionResult, model: str, created: int) -> dict[str, Any]:
    body = _envelope(f"cmpl-{result.job}", model, created, result.text, result.finish_reason)
    return {**body, "usage": _usage(result), "specmarket": extension(result)}


def chunk_object(cid: str, model: str, created: int, text: str, tokens: tuple[int, ...]) -> dict[str, Any]:
    return {**_envelope(cid, model, created, text, None), "specmarket": {"tokens": list(tokens)}}


def final_chunk_object(cid: str, model: str, created: int, result: CompletionResult) -> dict[str, Any]:
    body = _envelope(cid, model, created, "", result.finish_reason)
    return {**body, "usage": _usage(result), "specmarket": extension(result)}


def models_object(model: str, created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": created, "owned_by": "specmarket"}]}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP specmarket_{name} {help_text}", f"# TYPE specmarket_{name} {kind}"]
    return lines + [f"specmarket_{name}{labels} {value}" for labels, value in samples]


def _drafter_series(drafters: dict[str, Any]) -> dict[str, list[tuple[str, float]]]:
    """field -> [(label set, value)] for every finite numeric field of every drafter."""
    series: dict[str, list[tuple[str, float]]] = {}
    for peer in sorted(drafters, key=str):
        stats = drafters[peer]
        if not isinstance(stats, dict):
            continue
        for key, value in stats.items():
            if isinstance(key, str) and METRIC_NAME.fullmatch(key) and _is_number(value):
                series.setdefault(key, []).append((f'{{peer="{_label(str(peer))}"}}', value))
    return series


def render_metrics(counters: dict[str, int], drafters: dict[str, Any]) -> str:
    """Prometheus text exposition format 0.0.4."""
    lines: list[str] = []
    for key, name, kind, help_text in ENGINE_METRICS:
        lines += _family(name, kind, help_text, [("", counters.get(key, 0))])
    lines += _family("drafters_known", "gauge", "Drafter peers the target knows of.", [("", len(drafters))])
    for key, samples in sorted(_drafter_series(drafters).items()):
        gauge = key.endswith(GAUGE_SUFFIXES) or any(isinstance(v, float) for _, v in samples)
        name = f"drafter_{key}" if gauge or key.endswith("_total") else f"drafter_{key}_total"
        kind = "gauge" if gauge else "counter"
        lines += _family(name, kind, f"Per-drafter {key.replace('_', ' ')}.", samples)
    return "\n".join(lines) + "\n"
