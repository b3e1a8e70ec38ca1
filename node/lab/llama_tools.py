"""llama.cpp's own quality tools on a GGUF, run and parsed: ``llama-perplexity`` (its perplexity over
a text file), ``llama-completion`` (a greedy continuation of a prompt) and ``llama-tokenize`` (the
token ids its tokenizer gives a text). node.lab.llama_cpp builds them; node.lab.quality compares
their results with ours.

Two of llama.cpp's input rules matter for feeding every side the same tokens, and every command here
sets them: common's ``-f`` drops one trailing newline of the file (``llama-tokenize`` reads its file
verbatim), and escape sequences (a literal backslash-n) are expanded unless ``--no-escape``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

from node.lab.llama_cpp import LlamaCppError, pin, run_tool, tail

PERPLEXITY_TIMEOUT_S = 3 * 3600.0
COMPLETION_TIMEOUT_S = 600.0
TOKENIZE_TIMEOUT_S = 300.0
END_OF_TEXT = " [end of text]\n"  # llama-completion's line after an end-of-generation token


@dataclass(frozen=True)
class LlamaPerplexity:
    """``llama-perplexity``'s estimate: exp(mean NLL) over the second half of each chunk, and its ±."""

    ppl: float
    plus_minus: float
    chunks: int
    n_ctx: int
    running: tuple[float, ...]  # the running estimate after each chunk, as it prints them
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class LlamaCompletion:
    """``llama-completion``'s greedy continuation: the prompt ids it evaluated (its verbose prompt)
    and the text it generated (special tokens written out), and whether it stopped at an end of
    generation token before its token budget."""

    prompt_ids: tuple[int, ...]
    text: str
    ended: bool
    command: tuple[str, ...] = ()


# ---- parsing -----------------------------------------------------------------------------------------

_FINAL = re.compile(r"Final estimate: PPL = ([0-9.eE+-]+|nan|inf) \+/- ([0-9.eE+-]+|nan|inf)")
_CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)")
_RUNNING = re.compile(r"\[(\d+)\]([0-9.eE+-]+|nan|inf),")
_PROMPT_COUNT = re.compile(r"number of tokens in prompt = (\d+)")
_PROMPT_TOKEN = re.compile(r"^(?:[0-9.]+ [A-Z] )? *(\d+) -> '", re.M)  # after the log's time and level, if any


def parse_perplexity_output(text: str) -> LlamaPerplexity:
    """The estimate in llama-perplexity's output (stdout and stderr together)."""
    final, chunks = _FINAL.search(text), _CHUNKS.search(text)
    if final is None or chunks is None:
        raise LlamaCppError("llama-perplexity's output has no 'calculating perplexity over' or 'Final estimate' line")
    ppl, spread = float(final.group(1)), float(final.group(2))
    n_chunks, n_ctx = int(chunks.group(1)), int(chunks.group(2))
    running = tuple(float(m.group(2)) for m in _RUNNING.finditer(text))
    if not (math.isfinite(ppl) and ppl >= 1 and math.isfinite(spread) and spread >= 0):
        raise LlamaCppError(f"llama-perplexity's estimate is PPL = {ppl} ± {spread}")
    if len(running) != n_chunks or not running or abs(running[-1] - ppl) > 1e-3 * ppl:
        raise LlamaCppError(
            f"llama-perplexity printed {len(running)} running estimates for {n_chunks} chunks, "
            f"the last {running[-1] if running else None} against its final {ppl}"
        )
    return LlamaPerplexity(ppl, spread, n_chunks, n_ctx, running)


def parse_token_ids(stdout: str) -> tuple[int, ...]:
    """``llama-tokenize --ids``'s list, e.g. ``[785, 6094, 13]``: its last line that is one."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("["):
            try:
                ids = json.loads(line)
            except ValueError:
                break
            if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                return tuple(ids)
            break
    raise LlamaCppError(f"llama-tokenize printed no list of token ids: {stdout[-200:]!r}")


def parse_verbose_prompt(stderr: str) -> tuple[int, ...]:
    """The prompt's token ids in ``--verbose-prompt``'s listing (``0.01.739.668 I 151644 -> '<|im_start|>'``)."""
    count = _PROMPT_COUNT.search(stderr)
    if count is None:
        raise LlamaCppError("llama-completion's output has no 'number of tokens in prompt' line (--verbose-prompt)")
    n = int(count.group(1))
    ids = tuple(int(m.group(1)) for m in _PROMPT_TOKEN.finditer(stderr, count.end()))[:n]
    if len(ids) != n:
        raise LlamaCppError(f"llama-completion listed {len(ids)} of its {n} prompt tokens")
    return ids


def parse_completion_stdout(stdout: str) -> tuple[str, bool]:
    """(generated text, whether it ended at an end-of-generation token) from llama-completion's stdout
    with ``--no-display-prompt``: the text, `` [end of text]`` and a newline if it ended there, then
    the two newlines it writes last."""
    if not stdout.endswith("\n\n"):
        raise LlamaCppError(f"llama-completion's stdout does not end as a finished run does: {stdout[-200:]!r}")
    text = stdout[:-2]
    if text.endswith(END_OF_TEXT):
        return text.removesuffix(END_OF_TEXT), True
    return text, False


# ---- running -----------------------------------------------------------------------------------------


def checked(binary: Path, *files: Path) -> None:
    """Every file a llama.cpp run needs exists (else one clear error naming where it comes from)."""
    for path in (binary, *files):
        if not Path(path).is_file():
            raise LlamaCppError(f"no {path} (llama.cpp's tools come from ensure_llama_cpp, the GGUF from make setup)")


def _pinned(command: list[str], cpu: int | None) -> list[str]:
    return command if cpu is None else pin(command, cpu)


def run_perplexity(
    binary: Path,
    gguf: Path,
    text_file: Path,
    n_ctx: int = 512,
    chunks: int | None = None,
    cpu: int | None = 0,
    timeout_s: float = PERPLEXITY_TIMEOUT_S,
) -> LlamaPerplexity:
    """``llama-perplexity`` on one thread over ``text_file`` (as it reads it: one trailing newline
    dropped), in chunks of ``n_ctx`` with one chunk a batch (``-b n_ctx``), the first ``chunks``."""
    checked(binary, gguf, text_file)
    command = [str(binary), "-m", str(gguf), "-f", str(text_file), "--no-escape", "-t", "1", "-c", str(n_ctx)]
    command += ["-b", str(n_ctx), *(["--chunks", str(chunks)] if chunks is not None else [])]
    command = _pinned(command, cpu)
    done = run_tool(command, timeout_s)
    try:
        result = parse_perplexity_output(done.stdout + done.stderr)
    except LlamaCppError as e:
        raise LlamaCppError(f"{e}; its stderr ends:\n{tail(done.stderr)}") from None
    return replace(result, command=tuple(command))


def run_tokenize(binary: Path, gguf: Path, text_file: Path, timeout_s: float = TOKENIZE_TIMEOUT_S) -> tuple[int, ...]:
    """The ids llama.cpp's tokenizer gives ``text_file``'s bytes as llama-perplexity tokenizes text:
    special-token text not parsed, BOS only where the vocabulary asks for it."""
    checked(binary, gguf, text_file)
    command = [str(binary), "-m", str(gguf), "-f", str(text_file), "--ids", "--no-parse-special", "--no-escape"]
    command.append("--log-disable")
    done = run_tool(command, timeout_s)
    return parse_token_ids(done.stdout)


def run_completion(
    binary: Path,
    gguf: Path,
    prompt_file: Path,
    n_predict: int,
    cpu: int | None = 0,
    timeout_s: float = COMPLETION_TIMEOUT_S,
) -> LlamaCompletion:
    """``llama-completion``'s greedy continuation (``--temp 0 --top-k 1``, no repetition penalty, no
    chat mode: the prompt file already holds the chat-templated text, special tokens parsed) of at most
    ``n_predict`` tokens, on one thread. Write the prompt file with one newline more than the prompt
    (``-f`` drops one)."""
    checked(binary, gguf, prompt_file)
    command = [str(binary), "-m", str(gguf), "-f", str(prompt_file), "--no-escape", "-no-cnv", "--no-display-prompt"]
    command += ["--verbose-prompt", "-sp", "--temp", "0", "--top-k", "1", "--repeat-penalty", "1", "--seed", "0"]
    command += ["-n", str(n_predict), "-t", "1", "-c", "4096"]
    command = _pinned(command, cpu)
    done = run_tool(command, timeout_s)
    try:
        text, ended = parse_completion_stdout(done.stdout)
        prompt_ids = parse_verbose_prompt(done.stderr + done.stdout)
    except LlamaCppError as e:
        raise LlamaCppError(f"{e}; its stderr ends:\n{tail(done.stderr)}") from None
    return LlamaCompletion(prompt_ids, text, ended, tuple(command))
