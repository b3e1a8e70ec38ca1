"""`specmarket generate`: local plain or speculative decoding with a chosen proposer."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from node.models import DEFAULT_DRAFT, DEFAULT_TARGET, ModelPair, load_pair
from verifier.decode import DecodeResult, Proposer, decode_plain, decode_speculative
from verifier.errors import ContextTooLong, InvalidParams
from verifier.params import SamplingParams
from verifier.proposers import AdversarialProposer, GarbageProposer, LocalDraftProposer, LyingProposer, RandomProposer
from verifier.verify import Rule

DRAFTERS = ("none", "local", "random", "adversarial", "lying", "garbage")
DEFAULT_GAMMA = 4
LYING_WANTED_TEXT = "!"  # the token the lying drafter tries to force into every answer


@dataclass(frozen=True)
class GenerateConfig:
    prompt: str
    seed: int = 0
    max_new_tokens: int = 64
    params: SamplingParams = field(default_factory=SamplingParams)
    gamma: int = DEFAULT_GAMMA
    drafter: str = "local"
    rule: Rule = Rule.GUMBEL
    target_model: Path = DEFAULT_TARGET
    draft_model: Path = DEFAULT_DRAFT

    def __post_init__(self) -> None:
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


def build_proposer(name: str, pair: ModelPair, rng_seed: int = 0) -> Proposer | None:
    vocab = pair.target.vocab_size
    if name == "none":
        return None
    if name == "local":
        if pair.draft is None:
            raise InvalidParams("--drafter local needs a draft model")
        return LocalDraftProposer(pair.draft)
    if name == "random":
        return RandomProposer(vocab, rng_seed)
    if name == "adversarial":
        return AdversarialProposer(pair.target.fork())  # ranks with the target's weights, own cache
    if name == "lying":
        return LyingProposer(vocab, lying_wanted_token(pair.tokenizer))
    if name == "garbage":
        return GarbageProposer(vocab)
    raise InvalidParams(f"unknown drafter {name!r}")


def run_decode(pair: ModelPair, cfg: GenerateConfig, prompt_ids: list[int], on_token=None) -> DecodeResult:
    proposer = build_proposer(cfg.drafter, pair)
    common = dict(params=cfg.params, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens, on_token=on_token)
    if proposer is None:
        return decode_plain(pair.target, prompt_ids, **common)
    return decode_speculative(pair.target, proposer, prompt_ids, gamma=cfg.gamma, rule=cfg.rule, **common)


def generate(cfg: GenerateConfig, pair: ModelPair | None = None, on_text=None) -> dict:
    """Run one generation and return the JSON-ready result (tokens, text, stats)."""
    if pair is None:
        need_draft = cfg.drafter == "local"
        pair = load_pair(cfg.target_model, cfg.draft_model if need_draft else None)
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
