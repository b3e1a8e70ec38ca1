"""`specmarket bench-quality`: is the exact target still the published model? (issue 39 §5)

Three measurements, each beside a reference:

1. **Perplexity** on a held-out text: the repository's own documentation (README.md and docs/*.md,
   sorted by path and concatenated), written long after the models were trained. It follows
   llama.cpp's ``llama-perplexity`` so the numbers compare: the whole text is tokenized once, cut into
   ``n_ctx``-token chunks (a partial last chunk is dropped), each chunk is one prefill pass from an
   empty cache, and only the second half of each chunk is scored (the logits at positions n_ctx/2 ..
   n_ctx - 2 against the next tokens: n_ctx/2 - 1 tokens a chunk). The exact target, the float16
   target and llama.cpp's own tool on the same GGUF and text.
2. **Greedy agreement with llama.cpp** on QWEN_PROMPTS through the chat template: the exact target's
   greedy continuation against ``llama-completion``'s on the same GGUF and the same prompt ids.
3. **Draft acceptance**: the draft's greedy acceptance teacher-forced on the exact target's own greedy
   answers (node.lab.draft_length's traces), as docs/target-performance.md measures it.

The measurements are in node.lab.quality_run (which runs them and prints the table); this module
holds the pure parts: the text, the chunking, the scoring and the comparisons.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from verifier.errors import SpecmarketError
from verifier.model import common_prefix

REPO_DIR = Path(__file__).resolve().parents[2]
N_CTX = 512  # llama-perplexity's usual context, and the figure its published tables quote
MIN_TEXT_TOKENS = 20_000  # issue 39 §5: a held-out text of at least this many tokens


class QualityError(SpecmarketError):
    """A quality measurement that cannot be made as asked (too short a text, mismatched tokens)."""


@dataclass(frozen=True)
class HeldOutText:
    text: str
    files: tuple[str, ...]  # repository paths, in the order concatenated

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


@dataclass(frozen=True)
class Perplexity:
    """exp(mean NLL) over the scored tokens, and llama-perplexity's ± (the standard error of the mean
    NLL, times the perplexity)."""

    ppl: float
    plus_minus: float
    mean_nll: float
    scored: int  # tokens scored
    chunks: int


@dataclass(frozen=True)
class Agreement:
    """Two greedy continuations of one prompt, position by position."""

    common_prefix: int
    equal_fraction: float  # positions equal / the longer continuation's length
    ours: int  # lengths
    theirs: int


def held_out_text(repo: Path = REPO_DIR) -> HeldOutText:
    """README.md and docs/*.md, sorted by their repository path, concatenated as they are."""
    paths = sorted([repo / "README.md", *(repo / "docs").glob("*.md")], key=lambda p: p.relative_to(repo).as_posix())
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise QualityError(f"the held-out text's files are missing: {', '.join(map(str, missing))}")
    return HeldOutText("".join(p.read_text() for p in paths), tuple(p.relative_to(repo).as_posix() for p in paths))


def text_ids(tokenizer, text: str) -> list[int]:
    """The text's token ids as llama-perplexity tokenizes it (``common_tokenize(ctx, text, true)``):
    the vocabulary's own special tokens added where it asks for them, special-token *text* inside the
    document (docs/exact-arithmetic.md quotes ``<|endoftext|>``) tokenized as plain text."""
    return list(tokenizer(text, add_special_tokens=True, split_special_tokens=True)["input_ids"])


def chunk_bos(tokenizer) -> int | None:
    """The token that starts every chunk, or None. llama-perplexity overwrites each chunk's first
    token with BOS only if ``llama_vocab_get_add_bos`` (the GGUF's ``tokenizer.ggml.add_bos_token``);
    Qwen2's GGUF says false (and its pre-tokenizer ``qwen2`` defaults to false), so its chunks are the
    text's own tokens. The HF tokenizer carries the same flag as ``add_bos_token``."""
    if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None:
        return int(tokenizer.bos_token_id)
    return None


def chunk_windows(ids: Sequence[int], n_ctx: int, bos: int | None, chunks: int | None = None) -> list[list[int]]:
    """llama-perplexity's chunks: consecutive ``n_ctx``-token windows of ``ids`` (a partial last one
    dropped; the first ``chunks`` of them when given), each one's first token *replaced* by ``bos``
    (not shifted) when there is one."""
    if n_ctx < 4 or n_ctx % 2:
        raise QualityError(f"n_ctx must be even and at least 4, got {n_ctx}")
    n = len(ids) // n_ctx if chunks is None else min(chunks, len(ids) // n_ctx)
    if len(ids) < 2 * n_ctx or n < 1:
        raise QualityError(f"{len(ids)} tokens make {n} chunks of {n_ctx}; llama-perplexity needs 2 × n_ctx tokens")
    windows = [list(ids[i * n_ctx : (i + 1) * n_ctx]) for i in range(n)]
    if bos is not None:
        for window in windows:
            window[0] = bos
    return windows


def second_half_nll(logits: np.ndarray, window: Sequence[int]) -> np.ndarray:
    """NLL (float64, as llama-perplexity's log_softmax) of each token of the window's second half but
    its first: the logits at positions first .. n - 2 (first = n // 2) against tokens first + 1 .. n - 1."""
    n = len(window)
    first = n // 2
    rows = np.asarray(logits[first : n - 1], dtype=np.float64)
    targets = np.asarray(window[first + 1 : n])
    top = rows.max(axis=1)
    log_z = top + np.log(np.exp(rows - top[:, None]).sum(axis=1))
    return log_z - rows[np.arange(len(targets)), targets]


def summarize(nll: np.ndarray, chunks: int) -> Perplexity:
    """llama-perplexity's estimate: PPL = exp(mean), ± = PPL · sqrt((mean(nll²) − mean²) / (count − 1))."""
    count = len(nll)
    mean = float(nll.mean())
    var = float((nll * nll).mean()) - mean * mean
    ppl = math.exp(mean)
    spread = ppl * math.sqrt(var / (count - 1)) if var > 0 and count > 1 else 0.0
    return Perplexity(ppl, spread, mean, count, chunks)


def perplexity(model, windows: Sequence[Sequence[int]], progress: str | None = None) -> Perplexity:
    """The model's perplexity over the chunks: each chunk one prefill pass (``extend`` of all its
    tokens at once) from an empty cache, the second half of it scored."""
    from tqdm import tqdm

    nll = []
    for window in tqdm(windows, desc=progress, unit="chunk", disable=progress is None, leave=False):
        model.reset()
        nll.append(second_half_nll(model.extend(list(window)), window))
    model.reset()
    return summarize(np.concatenate(nll), len(windows))


def relative(a: float, b: float) -> float:
    """(a − b) / b."""
    return (a - b) / b


def agreement(ours: Sequence[int], theirs: Sequence[int]) -> Agreement:
    """Common prefix, and the fraction of positions where both have the same token, over the longer
    of the two (a position only one of them reached counts as unequal)."""
    longest = max(len(ours), len(theirs))
    equal = sum(1 for a, b in zip(ours, theirs, strict=False) if a == b)
    return Agreement(common_prefix(ours, theirs), equal / longest if longest else 1.0, len(ours), len(theirs))


def until_end(tokens: Sequence[int], stop: Sequence[int]) -> list[int]:
    """``tokens`` up to and including the first of ``stop`` (where a served answer ends)."""
    for i, t in enumerate(tokens):
        if t in stop:
            return list(tokens[: i + 1])
    return list(tokens)


def greedy_answer(model, prompt: Sequence[int], n: int) -> list[int]:
    """The model's greedy continuation of ``prompt``, ``n`` tokens, through an end of sequence (as
    draft_length's traces decode: the draft's acceptance is measured on exactly ``n`` positions)."""
    from verifier.decode import decode_plain
    from verifier.params import SamplingParams

    model.reset()
    out = decode_plain(model, list(prompt), params=SamplingParams(temperature=0.0), seed=0, max_new_tokens=n)
    return list(out.tokens)


def greedy_acceptance(draft, prompt: Sequence[int], answer: Sequence[int]) -> tuple[int, int]:
    """(matches, positions): the draft's argmax equals the target's token, teacher-forced on ``answer``
    (node.lab.draft_length.trace_over with greedy params)."""
    from node.lab.draft_length import trace_over
    from verifier.params import SamplingParams

    trace = trace_over(draft, list(prompt), list(answer), SamplingParams(temperature=0.0), 0)
    return sum(trace.matches), len(trace.matches)
