"""Chat messages -> prompt token ids, through the model's chat template.

A real chat model ships its own template (``tokenizer.chat_template``, e.g. SmolLM2-Instruct's
ChatML) and it is used as it is. A tokenizer without one, like the shipped tiny tokenizer (trained on
plain code, never on chats), gets ``FALLBACK_CHAT_TEMPLATE``: the end-of-text token as a document
boundary (as ``encode_prompt`` starts every completion), then ``<|role|>``, a newline, the content and
a newline per message, and ``<|assistant|>`` + newline as the cue to answer. The tiny model has no
notion of turns, so its chat answers are plain continuations of that text.

The ids returned are what the engine conditions on and what the receipt commits to, so an answer
is audited and challenged exactly like a completion.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from jinja2 import TemplateError

from verifier.errors import InvalidParams

ROLES = ("system", "user", "assistant")
FALLBACK_CHAT_TEMPLATE = (
    "{{ eos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def chat_prompt(tokenizer, messages: Sequence[Mapping[str, str]]) -> tuple[int, ...]:
    """The prompt token ids of ``messages`` ({"role", "content"} each), ending with the cue for the
    assistant's answer; a template that refuses the conversation is an ``InvalidParams``."""
    template = None if getattr(tokenizer, "chat_template", None) else FALLBACK_CHAT_TEMPLATE
    conversation = [{"role": m["role"], "content": m["content"]} for m in messages]
    try:
        encoded = tokenizer.apply_chat_template(
            conversation, chat_template=template, add_generation_prompt=True, tokenize=True, return_dict=True
        )
    except TemplateError as exc:  # templates raise on conversations they do not support
        raise InvalidParams(f"the model's chat template refused the messages: {exc}") from exc
    return tuple(int(t) for t in encoded["input_ids"])
