"""The draft-invariance check shared by the tiny and the real pair: GUMBEL speculative output must
equal plain decoding's for the same seed; a flip counts as a near-tie only where plain decoding's
top-two noisy scores are closer than TOLERANCE_DELTA (docs/design.md §4)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from node.model.decoding import pair_proposer
from verifier.decode import decode_plain, decode_speculative
from verifier.model import score
from verifier.params import SamplingParams
from verifier.tolerance import TOLERANCE_DELTA
from verifier.verify import score_margin


@dataclass
class InvarianceReport:
    runs: int = 0
    near_ties: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def check(self, max_near_tie_fraction: float, label: str) -> None:
        for record in self.near_ties:
            warnings.warn(f"near-tie flip: {record}", stacklevel=2)
        print(f"{label}: {self.runs} runs, {len(self.near_ties)} near-tie flips, {len(self.failures)} real mismatches")
        assert not self.failures, "speculative output differs from plain decoding:\n" + "\n".join(self.failures)
        assert len(self.near_ties) <= max_near_tie_fraction * self.runs, self.near_ties


class _PassRecorder:
    """The target as plain decoding drives it, keeping the last logit row of each pass: the rows
    plain decoding sampled from, so that a caller can compare them without scoring them again."""

    def __init__(self, model) -> None:
        self.model, self.vocab_size, self.rows = model, model.vocab_size, []

    def cached(self) -> Sequence[int]:
        return self.model.cached()

    def extend(self, tokens: Sequence[int]) -> np.ndarray:  # -> [len(tokens), V]
        logits = self.model.extend(tokens)
        self.rows.append(logits[-1])
        return logits

    def rollback(self, n: int) -> None:
        self.model.rollback(n)


def _first_diff(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def check_invariance(
    pair,
    prompts: Sequence[list[int]],
    drafters: Sequence[str],
    temperatures: Sequence[float],
    *,
    max_new: int,
    gamma: int,
    on_plain: Callable[[list[int], list[int], np.ndarray], None] | None = None,
) -> InvarianceReport:
    """Every prompt × temperature × drafter, seed = the prompt's index; ``on_plain(ids, tokens,
    rows)`` sees each plain decoding with the logit rows it sampled from ([len(tokens), V]: row i
    after ``ids + tokens[:i]``; row 0 from one pass over the whole prompt, each later row from a
    one-position pass), e.g. to measure logit drift."""
    report = InvarianceReport()
    for temperature in temperatures:
        params = SamplingParams(temperature=temperature)
        for seed, ids in enumerate(prompts):
            pair.target.reset()  # plain decoding prefills the whole prompt in one pass (a shape callers can repeat)
            recorder = _PassRecorder(pair.target)
            plain = decode_plain(recorder, ids, params=params, seed=seed, max_new_tokens=max_new).tokens
            if on_plain is not None:
                on_plain(ids, list(plain), np.stack(recorder.rows))
            for name in drafters:
                report.runs += 1
                proposer = pair_proposer(name, pair, rng_seed=seed)
                spec = decode_speculative(
                    pair.target, proposer, ids, params=params, seed=seed, max_new_tokens=max_new, gamma=gamma
                ).tokens
                if spec == plain:
                    continue
                k = _first_diff(spec, plain)
                margin = score_margin(score(pair.target.fork(), [*ids, *plain[:k]])[0][-1], params, seed, k)
                record = f"T={temperature} prompt#{seed} {name}: token {k} differs, margin {margin:.2e}"
                (report.near_ties if margin < TOLERANCE_DELTA else report.failures).append(record)
    return report


def check_first_token_fit(name: str, target_logits: np.ndarray, draft_logits: np.ndarray) -> None:
    """Exactness on a real next-token distribution: the first emitted token of a one-draft round
    under proposer ``name`` (honest, random, adversarial or lying), for as many seeds as catch a
    deviation of Cohen's w = 0.1 with power 0.99, against the target's distribution at T = 1
    (chi-square, p > 1e-3: tests/stats.py). ``*_logits``: [V]."""
    from tests.stats import check_fit, samples_for_power
    from verifier.params import token_probs
    from verifier.verify import noisy_scores, verify

    params = SamplingParams(temperature=1.0)
    probs = token_probs(target_logits, params)
    wanted = int(np.argsort(probs)[-20])  # a plausible but unlikely token a liar forces
    rng = np.random.default_rng(0)
    rows = np.stack([target_logits, target_logits])  # [γ+1, V]; the bonus row is not examined

    def draft(seed: int) -> int:
        if name == "honest":  # the coupled draft with the same Gumbel noise
            return int(np.argmax(noisy_scores(draft_logits, params, seed, 0)))
        if name == "random":
            return int(rng.integers(target_logits.size))
        return int(np.argmin(target_logits)) if name == "adversarial" else wanted

    expected = dict(enumerate(probs))
    n = samples_for_power(expected)
    firsts = [verify(rows, [draft(s)], params=params, seed=s, start=0).tokens[0] for s in range(n)]
    check_fit(firsts, expected, name)
