"""Stop sequences (OpenAI's ``stop``): where they end an answer, and its text without them.

The rule is the receipt's (``node.chain.receipts.RequestSpec.end_of``): an answer ends with the
first token whose text contains a stop sequence, and the receipt commits to the sequences, so a
challenger and a referee judge an answer's end by the same rule. The text a client gets leaves the
stop sequence and anything after it out, as OpenAI's does; a stream holds back the last characters
that could begin one until it is known that they do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from node.chain.receipts import RequestSpec
from node.model.decoding import text_of
from verifier.decode import StopAt


def stop_rule(spec: RequestSpec, tokenizer) -> StopAt | None:
    """The decode loop's ``stop_at`` for ``spec``'s stop sequences (None without any)."""
    if not spec.stop_sequences:
        return None
    text = partial(text_of, tokenizer)
    return lambda tokens, start: spec.end_of(tokens, text, start)


def finished_by_rule(spec: RequestSpec, tokenizer, tokens: Sequence[int]) -> bool:
    """Did a stop token or a stop sequence end ``tokens`` (finish_reason "stop"), not max_tokens?"""
    return spec.end_of(tokens, partial(text_of, tokenizer)) == len(tokens) if tokens else False


def cut_text(text: str, sequences: Sequence[str]) -> str:
    """``text`` up to its first stop sequence, which is left out (OpenAI's convention)."""
    at = min((i for s in sequences if (i := text.find(s)) >= 0), default=None)
    return text if at is None else text[:at]


class StopText:
    """A stream's text deltas (from ``node.target.engine.TextStream``), none of a stop sequence:
    the last (longest sequence - 1) characters wait until more text shows they begin none."""

    def __init__(self, stream, sequences: Sequence[str]) -> None:
        self.stream, self.sequences = stream, tuple(sequences)
        self.hold = max((len(s) for s in self.sequences), default=1) - 1
        self.text = ""  # all the text the stream gave so far
        self.sent = 0  # characters of it handed out

    def feed(self, tokens: Sequence[int]) -> str:
        self.text += self.stream.feed(tokens)
        return self._release(final=False)

    def flush(self) -> str:
        self.text += self.stream.flush()
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        cut = cut_text(self.text, self.sequences)
        end = len(cut) if final or len(cut) < len(self.text) else len(self.text) - self.hold
        delta = self.text[self.sent : max(self.sent, end)]
        self.sent = max(self.sent, end)
        return delta
