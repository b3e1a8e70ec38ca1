"""What `specmarket ask` checks a receipt against, computed here from the client's own model files,
never taken from the target: the prompt's tokens (its own tokenization of the prompt, or of the
chat), the model's stop tokens, and the model hash.

A plain prompt is tokenized as ``encode_prompt`` does on the target (the document boundary, then the
text; ``node.model.decoding.document_boundary``), but with the ``tokenizers`` package straight from
the model's ``tokenizer.json``: it loads in milliseconds (Qwen's in about 0.4 s) where importing
transformers and building its tokenizer take seconds. A chat goes through the model's chat template,
rendered as transformers renders it (``node.client.chat_render``); a model directory without a
``tokenizer.json``, or a template with transformers-only features, goes through transformers'
tokenizer (``node.target.chat``), as the target applies it. The model hash comes from the cache of
``node.model.hash_cache`` (each file's size and times; ``verify_model`` reads every file again).

A client without the model's files can still check the receipt's signature and the operator's
registration: ``Expected.missing`` then names what it could not check.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.client.chat_render import FastChatUnsupported, fast_chat_ids
from node.model.decoding import document_boundary, end_of_sequence_tokens
from node.model.hash_cache import cached_model_hash
from verifier.errors import SpecmarketError

log = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, str]]


class LocalModelError(SpecmarketError):
    """The client's model files cannot say what a receipt must commit to (no end-of-sequence token)."""


@dataclass(frozen=True)
class Expected:
    """What the receipt must commit to, as this client computes it; None where it has no model files."""

    model_dir: Path
    prompt: tuple[int, ...] | None
    stop_tokens: tuple[int, ...] | None  # the model's end-of-sequence tokens
    model_hash: bytes | None

    @property
    def missing(self) -> tuple[str, ...]:
        """What cannot be checked without model files (one line each), () when everything can."""
        if self.prompt is None:
            return (f"the prompt's tokens, the stop tokens and the model hash (no model files at {self.model_dir})",)
        return ()


def no_model_files(model_dir: Path) -> Expected:
    return Expected(model_dir, None, None, None)


def expect(
    model_dir: Path, prompt: str | Messages, *, verify_model: bool = False, hash_cache: Path | None = None
) -> Expected:
    """What a receipt for ``prompt`` (a completion's text, or a chat's messages) asked of the model
    at ``model_dir`` must commit to; ``no_model_files`` when the directory has no config.json."""
    if not (model_dir / "config.json").is_file():
        return no_model_files(model_dir)
    try:
        tokens, stops = fast_prompt(model_dir, prompt)
    except FastChatUnsupported:
        tokens, stops = transformers_prompt(model_dir, prompt)
    return Expected(model_dir, tokens, stops, cached_model_hash(model_dir, cache=hash_cache, verify=verify_model))


def fast_prompt(model_dir: Path, prompt: str | Messages) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prompt tokens, stop tokens) with the ``tokenizers`` package: a plain prompt after the
    document boundary, a chat through its template (``node.client.chat_render``). Raises
    ``FastChatUnsupported`` where only transformers can (no tokenizer.json, a transformers-only template)."""
    if not (model_dir / "tokenizer.json").is_file():
        raise FastChatUnsupported(f"{model_dir} has no tokenizer.json")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    eos = eos_token_id(model_dir, tokenizer)
    if isinstance(prompt, str):
        tokens = (document_boundary(tokenizer, eos), *tokenizer.encode(prompt).ids)
    else:
        tokens = fast_chat_ids(model_dir, tokenizer, prompt)
    return tokens, end_of_sequence_tokens(tokenizer, eos)


def transformers_prompt(model_dir: Path, prompt: str | Messages) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prompt tokens, stop tokens) with transformers' tokenizer: a chat through its template."""
    from transformers import AutoTokenizer

    from node.model.decoding import encode_prompt
    from node.target.chat import chat_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    tokens = encode_prompt(tokenizer, prompt) if isinstance(prompt, str) else chat_prompt(tokenizer, prompt)
    if tokenizer.eos_token_id is None:
        raise LocalModelError(f"the tokenizer at {model_dir} names no end-of-sequence token")
    return tuple(tokens), end_of_sequence_tokens(tokenizer)


def eos_token_id(model_dir: Path, tokenizer: Any) -> int:
    """The end-of-sequence token's id, where transformers finds it: ``eos_token`` in
    tokenizer_config.json, else in special_tokens_map.json (a string, or an object with ``content``)."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        token = _eos_token(model_dir / name)
        if token is not None and (found := tokenizer.token_to_id(token)) is not None:
            return int(found)
    raise LocalModelError(f"the tokenizer at {model_dir} names no end-of-sequence token in its vocabulary")


def _eos_token(path: Path) -> str | None:
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LocalModelError(f"cannot read {path}: {exc}") from exc
    token = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None
