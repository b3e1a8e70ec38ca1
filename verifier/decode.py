"""Decode loops: plain autoregressive decoding (the reference) and speculative decoding.

Both run over the ``LanguageModel`` interface; a proposer only ever changes how many tokens a
target pass yields, never which tokens (under Rule.GUMBEL).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from verifier.errors import InvalidParams, SpecmarketError
from verifier.model import LanguageModel, score
from verifier.params import SamplingParams
from verifier.proposal import DEFAULT_GAMMA, EMPTY, MAX_GAMMA, Proposal, validate_proposal
from verifier.tree import (
    MAX_TREE_NODES,
    DraftTree,
    keep_accepted,
    score_tree,
    supports_trees,
    validate_tree,
    verify_tree,
)
from verifier.verify import Rule, Verdict, sample_token, verify

log = logging.getLogger(__name__)

TokenCallback = Callable[[Sequence[int]], None]
# (the output so far, the length before this round's tokens) -> the length at which a stop rule that
# needs more than token ids (stop sequences: the answer's text) ends the answer, or None
StopAt = Callable[[Sequence[int], int], int | None]


class Proposer(Protocol):
    """Anything that drafts: a local model, a hostile test double, a remote peer."""

    name: str

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int) -> object:
        """Draft up to ``gamma`` tokens after ``context``; ``start`` is k of the first one."""


@dataclass
class DecodeStats:
    target_passes: int = 0
    target_positions: int = 0  # positions the target scored (prompt prefill included)
    draft_tokens_proposed: int = 0
    draft_tokens_accepted: int = 0
    invalid_proposals: int = 0
    accepted_per_round: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.draft_tokens_accepted / self.draft_tokens_proposed if self.draft_tokens_proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass (accepted drafts + the recovered/bonus token)."""
        rounds = len(self.accepted_per_round)
        return (sum(self.accepted_per_round) + rounds) / rounds if rounds else 0.0

    @classmethod
    def merged(cls, parts: Sequence[DecodeStats]) -> DecodeStats:
        """The stats of several decodes taken together (e.g. one benchmark mode over all prompts)."""
        return cls(
            target_passes=sum(p.target_passes for p in parts),
            target_positions=sum(p.target_positions for p in parts),
            draft_tokens_proposed=sum(p.draft_tokens_proposed for p in parts),
            draft_tokens_accepted=sum(p.draft_tokens_accepted for p in parts),
            invalid_proposals=sum(p.invalid_proposals for p in parts),
            accepted_per_round=[n for p in parts for n in p.accepted_per_round],
        )

    def to_dict(self) -> dict[str, float | int]:
        return {
            "target_passes": self.target_passes,
            "target_positions": self.target_positions,
            "draft_tokens_proposed": self.draft_tokens_proposed,
            "draft_tokens_accepted": self.draft_tokens_accepted,
            "invalid_proposals": self.invalid_proposals,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
        }


@dataclass(frozen=True)
class DecodeResult:
    tokens: tuple[int, ...]
    stats: DecodeStats


def _check_args(prompt: Sequence[int], max_new_tokens: int, gamma: int = 0) -> None:
    if not prompt:
        raise InvalidParams("the prompt must contain at least one token")
    if max_new_tokens < 0:
        raise InvalidParams(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not 0 <= gamma <= MAX_GAMMA:
        raise InvalidParams(f"gamma must be in [0, {MAX_GAMMA}], got {gamma}")


def _emit(
    out: list[int],
    new: Sequence[int],
    stop_tokens: Collection[int],
    on_token: TokenCallback | None,
    stop_at: StopAt | None = None,
) -> bool:
    """Append ``new`` to ``out`` up to and including its first stop token, or the token at which
    ``stop_at`` ends the answer; True when decoding must stop."""
    end = next((i + 1 for i, t in enumerate(new) if t in stop_tokens), None)
    if stop_at is not None and (at := stop_at([*out, *new[:end]], len(out))) is not None:
        end = at - len(out)
    if end is not None:
        new = new[:end]
    out.extend(new)
    if on_token is not None and new:
        on_token(new)
    return end is not None


def decode_plain(
    target: LanguageModel,
    prompt: Sequence[int],
    *,
    params: SamplingParams,
    seed: int,
    max_new_tokens: int,
    stop_tokens: Collection[int] = (),  # end at the first of these (the model's end of sequence)
    on_token: TokenCallback | None = None,
    stop_at: StopAt | None = None,  # and where this says (stop sequences)
) -> DecodeResult:
    """The reference: one target pass per token, y_k = sample_token(logits, params, seed, k)."""
    _check_args(prompt, max_new_tokens)
    stats, out = DecodeStats(), []
    while len(out) < max_new_tokens:
        logits, positions = score(target, [*prompt, *out])
        stats.target_passes += 1
        stats.target_positions += positions
        stats.accepted_per_round.append(0)
        if _emit(out, [sample_token(logits[-1], params, seed, len(out))], stop_tokens, on_token, stop_at):
            break
    return DecodeResult(tuple(out), stats)


def _propose(proposer: Proposer, context, k: int, gamma: int, params, seed, rule: Rule, target, stats) -> object:
    """The round's draft, checked: a Proposal, or a DraftTree where the target scores trees under
    Rule.GUMBEL (elsewhere a tree's first branch stands in for it)."""
    if gamma == 0:
        return EMPTY
    vocab = target.vocab_size
    try:
        raw = proposer.propose(context, start=k, gamma=gamma, params=params, seed=seed)
        if isinstance(raw, DraftTree):
            if rule is Rule.GUMBEL and supports_trees(target):
                return validate_tree(raw, gamma=gamma, vocab_size=vocab, max_nodes=MAX_TREE_NODES)
            raw = raw.first_branch()  # (LEVIATHAN has no exact tree rule here: SpecInfer's multi-step one)
        return validate_proposal(raw, gamma=gamma, vocab_size=vocab, need_probs=rule is Rule.LEVIATHAN)
    except SpecmarketError as exc:  # a bad or failed proposal costs speed, never correctness
        stats.invalid_proposals += 1
        level = logging.WARNING if stats.invalid_proposals == 1 else logging.DEBUG  # don't flood the log
        log.log(level, "proposer %s: proposal rejected at k=%d: %s (decoding this round alone)", proposer.name, k, exc)
        return EMPTY


def _verify_round(target, context, draft: Proposal | DraftTree, params, seed, k: int, rule: Rule):  # -> (Verdict, int)
    """One target pass over the round's draft (a chain, or a tree: verifier.tree) and its verdict;
    and the positions the pass scored."""
    if isinstance(draft, DraftTree):
        logits, positions, lead = score_tree(target, context, draft)  # [n+1, V]
        tree_verdict = verify_tree(logits, draft, params=params, seed=seed, start=k)
        keep_accepted(target, lead, tree_verdict.path)
        return Verdict(tree_verdict.tokens, tree_verdict.n_accepted), positions
    logits, positions = score(target, context, draft.tokens)  # [γ'+1, V]
    verdict = verify(logits, draft.tokens, params=params, seed=seed, start=k, rule=rule, draft_probs=draft.probs)
    return verdict, positions


def decode_speculative(
    target: LanguageModel,
    proposer: Proposer,
    prompt: Sequence[int],
    *,
    params: SamplingParams,
    seed: int,
    max_new_tokens: int,
    gamma: int,
    rule: Rule = Rule.GUMBEL,
    stop_tokens: Collection[int] = (),  # end at the first of these (the model's end of sequence)
    on_token: TokenCallback | None = None,
    stop_at: StopAt | None = None,  # and where this says (stop sequences)
) -> DecodeResult:
    """Speculative decoding: each round drafts γ tokens (or a tree of drafts, each branch up to γ
    deep) and verifies them in one target pass."""
    _check_args(prompt, max_new_tokens, gamma)
    stats, out = DecodeStats(), []
    while len(out) < max_new_tokens:
        k, context = len(out), [*prompt, *out]
        round_gamma = min(gamma, max_new_tokens - k - 1)  # never emit past max_new_tokens
        draft = _propose(proposer, context, k, round_gamma, params, seed, rule, target, stats)
        verdict, positions = _verify_round(target, context, draft, params, seed, k, rule)
        stats.target_passes += 1
        stats.target_positions += positions
        stats.draft_tokens_proposed += len(draft.tokens)
        stats.draft_tokens_accepted += verdict.n_accepted
        stats.accepted_per_round.append(verdict.n_accepted)
        if _emit(out, verdict.tokens, stop_tokens, on_token, stop_at):
            break
    return DecodeResult(tuple(out), stats)


def decode(
    target: LanguageModel,
    proposer: Proposer | None,
    prompt: Sequence[int],
    *,
    params: SamplingParams,
    seed: int,
    max_new_tokens: int,
    gamma: int = DEFAULT_GAMMA,
    rule: Rule = Rule.GUMBEL,
    stop_tokens: Collection[int] = (),  # end at the first of these (the model's end of sequence)
    on_token: TokenCallback | None = None,
    stop_at: StopAt | None = None,  # and where this says (stop sequences)
) -> DecodeResult:
    """Plain decoding without a proposer, speculative decoding with one: the single place where
    that choice is made (generate, the engine, the benchmarks and the sweep all come through here)."""
    common = dict(params=params, seed=seed, max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, on_token=on_token)
    common["stop_at"] = stop_at
    if proposer is None:
        return decode_plain(target, prompt, **common)
    return decode_speculative(target, proposer, prompt, gamma=gamma, rule=rule, **common)
