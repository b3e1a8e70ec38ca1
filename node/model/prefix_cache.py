"""Prefix caching: a new job's model starts with the cached keys and values of the longest prefix it
shares with the last prompt seen (chat prompts share their template's system turn).

The caches of a packed model's lean forward (``node.model.kernels.llama.LeanLM`` with
``shape_invariant``) can be copied exactly: every pass runs the skinny kernel row by row, so the keys
and values of a prefix are bit for bit what any prefill of those tokens computes, and every logit
after them is too. Any other model (HF's forward, or the lean forward over HF weights, whose wide
passes run torch's kernel) is forked empty, as before. Only the first pass of a job gets shorter: receipts,
challenges and the tokens sampled are untouched (tests/test_packed.py checks the logits equal).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from verifier.model import LanguageModel, common_prefix


class PrefixCache:
    """The last prompt's cache of one model, lent (as a copy) to the next job."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self._last: LanguageModel | None = None  # a copy holding the last kept prompt's positions
        self._lock = threading.Lock()  # jobs fork and keep from their own worker threads
        self.reused = 0  # prompt positions copied instead of recomputed, over all jobs

    def fork_for(self, prompt: Sequence[int]) -> LanguageModel:
        """A fork of the model for a job on ``prompt``, its cache holding the longest cached prefix of
        it (never the last prompt token: the first pass scores at least that one)."""
        with self._lock:
            last = self._last
            if last is None:
                return self.model.fork()
            n = min(common_prefix(last.cached(), prompt), len(prompt) - 1)
            self.reused += n
            return last.fork_with_prefix(n)

    def keep(self, model: LanguageModel, prompt_len: int) -> None:
        """Keep the prompt part of a finished job's cache (``model``, forked by ``fork_for``)."""
        if not getattr(model, "shape_invariant", False):
            return  # its prefix rows would differ with the prefill's width: not the same computation
        copy = model.fork_with_prefix(min(prompt_len, len(model.cached())))
        with self._lock:
            self._last = copy
