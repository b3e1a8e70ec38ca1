"""A chat's prompt tokens from the model's files, without transformers: its chat template rendered
with jinja2 as transformers renders it, then tokenized with the ``tokenizers`` package.

``specmarket ask --chat`` must know the prompt tokens the receipt commits to. transformers'
``apply_chat_template`` gives them, but importing transformers and building its tokenizer cost the
client about 3 s before the first token is even asked for. This module renders the same template
with the same environment settings (``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception``, ``strftime_now`` and a
non-escaping ``tojson``) and the same variables (the special tokens by name, the messages,
``add_generation_prompt=True``), then encodes the text without added special tokens, as
transformers does. The template is the model's own (``chat_template`` in tokenizer_config.json, or
``chat_template.jinja``), else ``node.target.chat.FALLBACK_CHAT_TEMPLATE``, as on the target.

tests/test_ask_client.py checks that these ids equal transformers' for every shipped model; a
template that needs more of transformers than this (its ``generation`` tags) is rendered
by ``node.client.expected.transformers_prompt`` instead: ``FastChatUnsupported``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from verifier.errors import InvalidParams, SpecmarketError

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILES = ("special_tokens_map.json", "tokenizer_config.json")  # later files override earlier ones
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# template features that only transformers' renderer provides; such a template goes the slow way
TRANSFORMERS_ONLY = ("{% generation", "{%- generation")


class FastChatUnsupported(SpecmarketError):
    """The model's chat template needs transformers' own renderer (see TRANSFORMERS_ONLY)."""


def fast_chat_ids(model_dir: Path, tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> tuple[int, ...]:
    """The prompt ids of ``messages`` through the chat template at ``model_dir``, ending with the cue
    for the assistant's answer, with ``tokenizer`` (a ``tokenizers.Tokenizer``) for the text."""
    template = chat_template(model_dir)
    if any(feature in template for feature in TRANSFORMERS_ONLY):
        raise FastChatUnsupported(f"the chat template at {model_dir} uses transformers-only features")
    text = render(template, messages, special_tokens(model_dir))
    return tuple(tokenizer.encode(text, add_special_tokens=False).ids)


def chat_template(model_dir: Path) -> str:
    """The model's template: tokenizer_config.json's ``chat_template`` (a string, or named templates
    of which "default" is used), else chat_template.jinja, else the target's fallback."""
    from node.target.chat import FALLBACK_CHAT_TEMPLATE

    config = _read_json(model_dir / "tokenizer_config.json")
    named = config.get("chat_template")
    if isinstance(named, list):
        named = next((t.get("template") for t in named if isinstance(t, dict) and t.get("name") == "default"), None)
    if isinstance(named, str) and named:
        return named
    path = model_dir / TEMPLATE_FILE
    return path.read_text() if path.is_file() else FALLBACK_CHAT_TEMPLATE


def special_tokens(model_dir: Path) -> dict[str, str]:
    """The special tokens by name (``eos_token`` ...), as strings, as templates see them."""
    found: dict[str, str] = {}
    for name in CONFIG_FILES:
        config = _read_json(model_dir / name)
        for key in SPECIAL_TOKEN_NAMES:
            token = config.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str):
                found[key] = token
    return found


def render(template: str, messages: Sequence[Mapping[str, str]], tokens: Mapping[str, str]) -> str:
    """The template's text for ``messages``; a template that refuses them is an ``InvalidParams``."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
    try:
        return env.from_string(template).render(
            messages=conversation, tools=None, documents=None, add_generation_prompt=True, **tokens
        )
    except TemplateError as exc:
        raise InvalidParams(f"the model's chat template refused the messages: {exc}") from exc


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise InvalidParams(f"cannot read {path}: {exc}") from exc
    return data if isinstance(data, dict) else {}
