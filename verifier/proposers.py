"""Built-in proposers: the honest local draft model and the hostile ones used by tests and demos.

Hostile proposers can slow decoding down but, under Rule.GUMBEL, never change its output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from verifier.decode import Proposer
from verifier.errors import InvalidParams
from verifier.model import LanguageModel, score
from verifier.params import SamplingParams, process_logits, processed_probs, token_probs
from verifier.proposal import Proposal
from verifier.verify import with_noise

GREEDY_CONFIDENCE = SamplingParams(1.0, 0, 1.0)  # greedy probs are one-hot: confidence is read at T = 1
LYING_CLAIMED_PROB = 1e-9  # the lie: "I sampled this token although I gave it probability 1e-9"


class LocalDraftProposer:
    """An honest draft model. Given the seed, it drafts with the target's Gumbel noise:
    x_k = argmax(processed draft logits / T + G_k), which makes its match rate approach
    Σ min(p, q) (Daliri, Musco & Suresh 2024). It also reports q honestly, so it is a valid
    drafter for Rule.LEVIATHAN (x_k is then an exact sample from q_k).
    """

    name = "local"

    def __init__(self, model: LanguageModel, min_confidence: float = 0.0) -> None:
        self.model = model
        self.min_confidence = min_confidence  # end the block after the first token the draft is less sure of

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int) -> Proposal:
        logits = score(self.model, context)[0][-1]  # [V]
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        confidence: list[float] = []
        for i in range(gamma):
            processed = process_logits(logits, params)  # [V]: once a token, for q and for the noisy argmax
            probs.append(processed_probs(processed, params))
            tokens.append(int(np.argmax(with_noise(processed, params, seed, start + i))))
            sure = probs[-1] if not params.greedy else token_probs(logits, GREEDY_CONFIDENCE)
            confidence.append(float(sure[tokens[-1]]))
            if confidence[-1] < self.min_confidence:
                break  # dynamic draft length (HF assisted generation's assistant_confidence_threshold)
            if i + 1 < gamma:
                logits = self.model.extend([tokens[-1]])[-1]
        return Proposal(tuple(tokens), np.stack(probs) if probs else None, tuple(confidence))


class RandomProposer:
    """Uniformly random tokens from its own RNG; it reports its (uniform) q honestly."""

    name = "random"

    def __init__(self, vocab_size: int, rng_seed: int = 0) -> None:
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(rng_seed)

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int) -> Proposal:
        tokens = tuple(int(t) for t in self.rng.integers(0, self.vocab_size, size=gamma))
        return Proposal(tokens, np.full((gamma, self.vocab_size), 1.0 / self.vocab_size))


class AdversarialProposer:
    """Proposes, at every position, the token ``model`` (normally the target) ranks lowest."""

    name = "adversarial"

    def __init__(self, model: LanguageModel) -> None:
        self.model = model

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int) -> Proposal:
        logits = score(self.model, context)[0][-1]
        tokens: list[int] = []
        for i in range(gamma):
            tokens.append(int(np.argmin(logits)))
            if i + 1 < gamma:
                logits = self.model.extend([tokens[-1]])[-1]
        probs = np.zeros((gamma, self.model.vocab_size))
        probs[np.arange(gamma), tokens] = 1.0  # deterministic choice, so q is one-hot: an honest claim
        return Proposal(tuple(tokens), probs)


class LyingProposer:
    """Always proposes ``wanted`` and claims q(wanted) = 1e-9. Under LEVIATHAN the acceptance
    probability min(1, p/q) is then 1 whenever p(wanted) > 1e-9: the forgery of docs/design.md §2.
    """

    name = "lying"

    def __init__(self, vocab_size: int, wanted: int) -> None:
        if not 0 <= wanted < vocab_size:
            raise ValueError(f"wanted token {wanted} outside the vocabulary")
        self.vocab_size = vocab_size
        self.wanted = wanted

    def claimed_probs(self, gamma: int) -> np.ndarray:  # [γ, V]
        row = np.full(self.vocab_size, (1.0 - LYING_CLAIMED_PROB) / (self.vocab_size - 1))
        row[self.wanted] = LYING_CLAIMED_PROB
        return np.tile(row, (gamma, 1))

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int) -> Proposal:
        return Proposal((self.wanted,) * gamma, self.claimed_probs(gamma))


class GarbageProposer:
    """Cycles through malformed proposals; validation must reject each without crashing."""

    name = "garbage"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.calls = 0

    def _garbage(self, gamma: int) -> object:
        v = self.vocab_size
        nan_probs = np.full((1, v), np.nan)
        return [
            None,
            "not a proposal",
            Proposal((v,)),  # id == V
            Proposal((-1,)),
            Proposal((1.5,)),  # type: ignore[arg-type]
            Proposal((True,)),
            Proposal(tuple(range(gamma + 1))),  # longer than γ
            Proposal("abc"),  # type: ignore[arg-type]
            Proposal((0,), nan_probs),
            Proposal((0,), np.zeros((1, v))),  # claims q(x) = 0
            Proposal((0,), np.ones((2, v)) / v),  # wrong shape
            Proposal((1 << 70,)),
        ][self.calls % 12]

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int) -> object:
        self.calls += 1
        return self._garbage(gamma)


PROPOSERS = ("honest", "lookup", "random", "adversarial", "lying", "garbage")  # the built-in proposers, by name


def build_proposer(
    name: str,
    draft: LanguageModel | None,
    *,
    vocab_size: int,
    lying_token: int,
    rng_seed: int = 0,
    ranker: LanguageModel | None = None,
) -> Proposer:
    """The built-in proposer ``name``: ``honest`` drafts with ``draft`` (a model with its own cache),
    ``lookup`` drafts by prompt lookup (no model), ``adversarial`` proposes the token ``ranker``
    (default: ``draft``) ranks lowest, ``lying``
    always proposes ``lying_token``, ``random`` draws from ``rng_seed``, ``garbage`` is malformed."""
    model = ranker if name == "adversarial" and ranker is not None else draft
    if name in ("honest", "adversarial") and model is None:
        raise InvalidParams(f"the {name} proposer needs a draft model")
    if name == "honest":
        return LocalDraftProposer(model)
    if name == "adversarial":
        return AdversarialProposer(model)
    if name == "lookup":
        from verifier.lookup import PromptLookupProposer

        return PromptLookupProposer()
    if name == "random":
        return RandomProposer(vocab_size, rng_seed)
    if name == "lying":
        return LyingProposer(vocab_size, lying_token)
    if name == "garbage":
        return GarbageProposer(vocab_size)
    raise InvalidParams(f"unknown proposer {name!r}; choose one of {', '.join(PROPOSERS)}")
