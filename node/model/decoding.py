"""Local decoding on a model pair: prompt encoding, the context-window check, the built-in
drafters, and `generate` (plain or speculative decoding in this process, as `specmarket generate`).

The target node's engine, the benchmarks and the γ sweep use the same pieces, so the local
reference decoder and the served answers cannot drift apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from node.model.loading import ModelPair, load_pair
from node.model.pairs import DEFAULT_PAIR, get_pair
from verifier.decode import DecodeResult, Proposer, decode
from verifier.errors import ContextTooLong, InvalidParams
from verifier.params import SamplingParams
from verifier.proposal import DEFAULT_GAMMA
from verifier.proposers import PROPOSERS, build_proposer
from verifier.verify import Rule

DRAFTERS = ("none", *PROPOSERS)  # who drafts for `generate`; none = plain decoding
LYING_WANTED_TEXT = "!"  # the token the lying drafter tries to force into every answer


@dataclass(frozen=True)
class GenerateConfig:
    prompt: str
    seed: int = 0
    max_new_tokens: int = 64
    params: SamplingParams = field(default_factory=SamplingParams)
    gamma: int = DEFAULT_GAMMA
    drafter: str = "honest"
    rule: Rule = Rule.GUMBEL
    pair: str = DEFAULT_PAIR  # named target/draft pair (node.model.pairs)
    target_model: Path | None = None  # default: the pair's target
    draft_model: Path | None = None  # default: the pair's draft

    def __post_init__(self) -> None:
        get_pair(self.pair)
        if self.drafter not in DRAFTERS:
            raise InvalidParams(f"unknown drafter {self.drafter!r}; choose one of {', '.join(DRAFTERS)}")


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Prompt token ids: the end-of-text token (a document boundary, as in training) + the text."""
    return [tokenizer.eos_token_id, *tokenizer.encode(text)]


def check_fits(pair: ModelPair, prompt_len: int, max_new_tokens: int) -> None:
    """Fail before decoding, not half-way, when the request cannot fit the context window."""
    window = pair.target.max_positions
    if prompt_len + max_new_tokens > window:
        raise ContextTooLong(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the context window of {window}"
        )


def lying_wanted_token(tokenizer) -> int:
    return tokenizer.encode(LYING_WANTED_TEXT)[0]


def pair_proposer(name: str, pair: ModelPair, rng_seed: int = 0) -> Proposer | None:
    """The drafter ``name`` of DRAFTERS for local decoding on ``pair`` (None for plain decoding).
    The adversarial drafter ranks with the target's own weights (a fork: its own cache)."""
    if name == "none":
        return None
    ranker = pair.target.fork() if name == "adversarial" else None
    vocab, lying = pair.target.vocab_size, lying_wanted_token(pair.tokenizer)
    return build_proposer(name, pair.draft, vocab_size=vocab, lying_token=lying, rng_seed=rng_seed, ranker=ranker)


def run_decode(pair: ModelPair, cfg: GenerateConfig, prompt_ids: list[int], on_token=None) -> DecodeResult:
    proposer = pair_proposer(cfg.drafter, pair)
    return decode(
        pair.target,
        proposer,
        prompt_ids,
        params=cfg.params,
        seed=cfg.seed,
        max_new_tokens=cfg.max_new_tokens,
        gamma=cfg.gamma,
        rule=cfg.rule,
        on_token=on_token,
    )


def generate(cfg: GenerateConfig, pair: ModelPair | None = None, on_text=None) -> dict:
    """Run one generation and return the JSON-ready result (tokens, text, stats)."""
    if pair is None:
        named = get_pair(cfg.pair)
        draft = named.draft_dir(cfg.draft_model) if cfg.drafter == "honest" else None
        pair = load_pair(named.target_dir(cfg.target_model), draft)
    pair.target.reset()
    if pair.draft is not None:
        pair.draft.reset()
    prompt_ids = encode_prompt(pair.tokenizer, cfg.prompt)
    check_fits(pair, len(prompt_ids), cfg.max_new_tokens)
    on_token = (lambda toks: on_text(pair.tokenizer.decode(list(toks)))) if on_text else None
    started = time.perf_counter()
    result = run_decode(pair, cfg, prompt_ids, on_token)
    wall = time.perf_counter() - started
    stats = result.stats.to_dict()
    stats["wall_seconds"] = round(wall, 4)
    stats["tokens_per_second"] = round(len(result.tokens) / wall, 2) if wall > 0 else 0.0
    return {
        "tokens": list(result.tokens),
        "text": pair.tokenizer.decode(list(result.tokens)),
        "prompt_tokens": prompt_ids,
        "seed": cfg.seed,
        "drafter": cfg.drafter,
        "rule": cfg.rule.value,
        "gamma": cfg.gamma if cfg.drafter != "none" else 0,
        "params": cfg.params.to_dict(),
        "stats": stats,
    }
