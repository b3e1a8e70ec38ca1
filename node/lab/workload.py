"""The lab's workload, written once: the prompt sets the demos and benchmarks send for each model
pair, how a prompt becomes token ids, and the names of the modes they compare."""

from __future__ import annotations

from dataclasses import dataclass

# Python prompts for the tiny pair (trained on the standard library; no notion of a chat)
CODE_PROMPTS = (
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n        ",
    "    for i in range(len(",
    "def read_lines(path):\n    with open(path) as f:\n        ",
    "import unittest\n\n\nclass TestParser(unittest.TestCase):\n    def test_",
    "    if not isinstance(value, int):\n        raise TypeError(",
    '"""Helpers for parsing command line options."""\n\nimport ',
    "        except OSError as exc:\n            ",
)
PARSE_ARGS_PROMPT = "def parse_args(argv):\n    parser = argparse."

# user messages for SmolLM2-135M-Instruct, chat and code alike. None is a training prompt of its
# draft, nor on a training topic (node/training/teacher.py): acceptance on them is held-out.
CHAT_PROMPTS = (
    "Why do leaves change colour in autumn?",
    "Write a Python function that returns the largest element of a list.",
    "Give me three tips for writing a clear email.",
    "Explain what a linked list is.",
    "Why does ice float on water?",
    "Write a Python function that counts the words in a sentence.",
    "How does a refrigerator keep food cold?",
    "What makes a good cup of tea?",
)

# user messages for the qwen2.5-coder pair: code first, then chat (a coder model answers both);
# the first six are the prompts the draft's greedy acceptance was first measured on
QWEN_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the difference between a list and a tuple in Python?",
    "Write a bash one-liner that counts the lines of every .py file under the current directory.",
    "Why is the sky blue? Answer in two sentences.",
    "Implement binary search in JavaScript.",
    "Write a minimal hash table in Go.",
    "Explain what a race condition is, with a short example.",
    "Give me three tips for writing a clear email.",
)


@dataclass(frozen=True)
class Workload:
    chat: bool  # prompts are user messages sent through the target's chat template
    bench: tuple[str, ...]  # bench-local and bench-p2p
    local_demo: tuple[str, ...]  # specmarket demo
    net_demo: tuple[str, ...]  # specmarket demo-net / make demo
    sweep: int = 0  # demo-net's in-process γ sweep runs on the first `sweep` of net_demo (0: all)
    sweep_repeats: int = 3  # interleaved; the fastest run of each configuration is kept


WORKLOADS = {
    # a 1.5B target pass costs ~0.25 s: the γ sweep (plain and four γ, in process) takes two prompts once
    "qwen2.5-coder": Workload(
        chat=True, bench=QWEN_PROMPTS, local_demo=QWEN_PROMPTS[:3], net_demo=QWEN_PROMPTS[:6], sweep=2, sweep_repeats=1
    ),
    "qwen2.5-coder-f16": Workload(  # the same pair with the float16 target: the same prompts, side by side
        chat=True, bench=QWEN_PROMPTS, local_demo=QWEN_PROMPTS[:3], net_demo=QWEN_PROMPTS[:6], sweep=2, sweep_repeats=1
    ),
    "smollm2": Workload(chat=True, bench=CHAT_PROMPTS, local_demo=CHAT_PROMPTS[:3], net_demo=CHAT_PROMPTS[:4]),
    "tiny": Workload(
        chat=False, bench=CODE_PROMPTS, local_demo=CODE_PROMPTS[:3], net_demo=(*CODE_PROMPTS[:3], PARSE_ARGS_PROMPT)
    ),
}


def prompt_ids(tokenizer, text: str, chat: bool) -> list[int]:
    """A prompt's token ids as the target serves it: through the chat template for a chat workload
    (what ``/v1/chat/completions`` conditions on), else as a completion (``encode_prompt``)."""
    from node.model.decoding import encode_prompt
    from node.target.chat import chat_prompt

    if chat:
        return list(chat_prompt(tokenizer, [{"role": "user", "content": text}]))
    return encode_prompt(tokenizer, text)


def ask(http: str, text: str, chat: bool, **kw) -> dict:
    """One non-streaming answer from a target's HTTP API: a chat completion or a completion."""
    from node.client.http import chat_complete, complete

    if chat:
        return chat_complete(http, [{"role": "user", "content": text}], **kw)
    return complete(http, text, **kw)


def credited(answers: list[dict]) -> dict[str, int]:
    """Peer id -> the draft tokens credited to it over ``answers`` (each answer's ``credits``)."""
    total: dict[str, int] = {}
    for answer in answers:
        for peer, n in answer["specmarket"]["credits"].items():
            total[peer] = total.get(peer, 0) + n
    return total


def job_rounds(http: str, job: str) -> list[dict]:
    """One answer's draft rounds, as the target recorded them (node.target.draft_timing.RoundRecord)."""
    import urllib.parse

    from node.client.http import http_json

    return http_json(f"{http}/api/jobs/{urllib.parse.quote(job, safe='')}/rounds")["rounds"]


# the networked demo's two serving modes (a speculating and a plain bonded target)
WITH_SPECULATION, WITHOUT_SPECULATION = "with_speculation", "without_speculation"
MODES = (WITH_SPECULATION, WITHOUT_SPECULATION)
MODE_TITLES = {WITH_SPECULATION: "with speculation", WITHOUT_SPECULATION: "without speculation"}
