"""llama.cpp's plain and speculative decoding of one prompt, timed by llama.cpp itself: the anchor
runs of ``specmarket bench-anchor`` (node.lab.bench_anchor).

- ``run_plain``: ``llama-completion``, greedy, ``n`` tokens; its ``common_perf_print`` lines
  give the prompt's prefill (prompt eval) and the decoding (eval: one run a token after the first).
- ``run_speculative``: ``llama-speculative-simple`` with the draft GGUF (``--spec-type draft-simple``,
  greedy, at most ``draft_max`` tokens a round); it prints the prompt's encoding and the decoding
  times, and how many draft tokens it drafted and accepted.

Both take the chat-templated prompt as a file whose special tokens are parsed (``-sp``-style: the same
ids as our tokenizer gives, checked by node.lab.quality's agreement part) with escapes off; ``-f``
drops one trailing newline, so the file holds one more. One thread runs pinned to one CPU
(``taskset``); more threads run on the CPUs this process may use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from node.lab.llama_cpp import LlamaCppError, pin, run_tool, tail
from node.lab.llama_tools import checked

RUN_TIMEOUT_S = 900.0
CONTEXT = 4096  # -c: every prompt and answer of the workload fits
GREEDY = ("--temp", "0", "--top-k", "1", "--repeat-penalty", "1", "--seed", "0")
PROMPT_FLAGS = ("--no-escape",)


@dataclass(frozen=True)
class TimedAnswer:
    """One answer, timed: the prompt's tokens and its prefill (with the first chunk of the answer:
    ``first_tokens``), the answer's tokens and the time after that first chunk; for speculation, the
    draft tokens drafted and accepted (None for plain). llama.cpp's runs and ours alike."""

    prompt_tokens: int
    prefill_s: float
    tokens: int
    decode_s: float
    first_tokens: int = 0  # tokens the prefill's pass gave (llama-completion: its first; speculation: 0)
    drafted: int | None = None
    accepted: int | None = None
    command: tuple[str, ...] = ()

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


# ---- parsing -----------------------------------------------------------------------------------------

_NUMBER = r"([0-9]+(?:\.[0-9]*)?)"
_PERF = r"(?:common_perf_print|llama_perf_context_print):"  # the tool's summary; the context's own (older builds)
_PROMPT_EVAL = re.compile(rf"{_PERF} prompt eval time = *{_NUMBER} ms / *(\d+) tokens")
_EVAL = re.compile(rf"{_PERF} +eval time = *{_NUMBER} ms / *(\d+) runs")
_ENCODED = re.compile(rf"encoded +(\d+) tokens in +{_NUMBER} seconds")
_DECODED = re.compile(rf"decoded +(\d+) tokens in +{_NUMBER} seconds")
_COUNT = {name: re.compile(rf"\b{name} += (\d+)$", re.M) for name in ("n_drafted", "n_accept")}


def _one(pattern: re.Pattern[str], text: str, what: str) -> re.Match[str]:
    found = pattern.search(text)
    if found is None:
        raise LlamaCppError(f"no {what} line in llama.cpp's output")
    return found


def parse_plain_timings(stderr: str) -> TimedAnswer:
    """``llama-completion``'s perf lines -> its prefill and decoding. The first token is sampled from
    the prompt's pass, so the decoded tokens are the eval runs plus that one."""
    prompt = _one(_PROMPT_EVAL, stderr, "prompt eval time")
    decode = _one(_EVAL, stderr, "eval time")
    runs = int(decode[2])
    return TimedAnswer(int(prompt[2]), float(prompt[1]) / 1000, runs + 1, float(decode[1]) / 1000, first_tokens=1)


def parse_speculative_output(text: str) -> TimedAnswer:
    """``llama-speculative-simple``'s closing lines -> its encoding, decoding and draft counts."""
    encoded, decoded = _one(_ENCODED, text, "encoded"), _one(_DECODED, text, "decoded")
    drafted, accepted = (int(_one(_COUNT[n], text, n)[1]) for n in ("n_drafted", "n_accept"))
    if accepted > drafted:
        raise LlamaCppError(f"llama.cpp reports {accepted} draft tokens accepted of {drafted} drafted")
    return TimedAnswer(int(encoded[1]), float(encoded[2]), int(decoded[1]), float(decoded[2]), 0, drafted, accepted)


# ---- running -----------------------------------------------------------------------------------------


def _threads(command: list[str], threads: int, cpu: int | None, *flags: str) -> list[str]:
    """``-t`` (and the draft's ``-td``) at ``threads``; one thread pinned to ``cpu`` (None: not pinned)."""
    command = [*command, *(x for flag in flags for x in (flag, str(threads)))]
    return pin(command, cpu) if threads == 1 and cpu is not None else command


def _run(command: list[str], parse, timeout_s: float) -> TimedAnswer:
    done = run_tool(command, timeout_s)
    try:
        return replace(parse(done.stderr + "\n" + done.stdout), command=tuple(command))
    except LlamaCppError as e:
        raise LlamaCppError(f"{e}; its stderr ends:\n{tail(done.stderr)}") from None


def run_plain(
    binary: Path, gguf: Path, prompt_file: Path, n: int, threads: int = 1, cpu: int | None = 0,
    timeout_s: float = RUN_TIMEOUT_S,
) -> TimedAnswer:  # fmt: skip
    """``n`` greedy tokens of ``llama-completion`` after the prompt in ``prompt_file`` (its end of
    generation ignored, as our runs ignore theirs: every run decodes ``n``)."""
    checked(binary, gguf, prompt_file)
    command = [str(binary), "-m", str(gguf), "-f", str(prompt_file), *PROMPT_FLAGS, "-no-cnv", "--no-display-prompt"]
    command += [*GREEDY, "-n", str(n), "--ignore-eos", "-c", str(CONTEXT)]
    return _run(_threads(command, threads, cpu, "-t"), parse_plain_timings, timeout_s)


def run_speculative(
    binary: Path, gguf: Path, draft_gguf: Path, prompt_file: Path, n: int, draft_max: int,
    threads: int = 1, cpu: int | None = 0, timeout_s: float = RUN_TIMEOUT_S,
) -> TimedAnswer:  # fmt: skip
    """``n`` greedy tokens of ``llama-speculative-simple`` with ``draft_gguf`` drafting at most
    ``draft_max`` tokens a round (its default minimum draft probability kept: llama.cpp's own policy)."""
    checked(binary, gguf, draft_gguf, prompt_file)
    command = [str(binary), "-m", str(gguf), "-md", str(draft_gguf), "-f", str(prompt_file), *PROMPT_FLAGS]
    command += ["--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max), *GREEDY]
    command += ["-n", str(n), "--ignore-eos", "-c", str(CONTEXT)]
    return _run(_threads(command, threads, cpu, "-t", "-td"), parse_speculative_output, timeout_s)
