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
from verifier.proposal import TARGET_GAMMA
from verifier.proposers import PROPOSERS, build_proposer
from verifier.verify import Rule

DRAFTERS = ("none", *PROPOSERS)  # who drafts for `generate`; none = plain decoding
DOCUMENT_BOUNDARY = "<|endoftext|>"  # the token between documents in pretraining, where the vocabulary has it
LYING_WANTED_TEXT = "!"  # the token the lying drafter tries to force into every answer


@dataclass(frozen=True)
class GenerateConfig:
    prompt: str
    seed: int = 0
    max_new_tokens: int = 64
    params: SamplingParams = field(default_factory=SamplingParams)
    gamma: int = TARGET_GAMMA  # the target's: a local run decodes as the served one does
    drafter: str = "honest"
    rule: Rule = Rule.GUMBEL
    pair: str = DEFAULT_PAIR  # named target/draft pair (node.model.pairs)
    target_model: Path | None = None  # default: the pair's target
    draft_model: Path | None = None  # default: the pair's draft
    ignore_eos: bool = False  # run to max_new_tokens past the model's end-of-sequence tokens

    def __post_init__(self) -> None:
        get_pair(self.pair)
        if self.drafter not in DRAFTERS:
            raise InvalidParams(f"unknown drafter {self.drafter!r}; choose one of {', '.join(DRAFTERS)}")


def _token_id(tokenizer, token: str) -> int | None:
    """``token``'s id in a transformers tokenizer or a ``tokenizers.Tokenizer``; None when absent."""
    if hasattr(tokenizer, "token_to_id"):  # tokenizers.Tokenizer (the client's fast path)
        return tokenizer.token_to_id(token)
    found = tokenizer.convert_tokens_to_ids(token)
    unknown = found == tokenizer.unk_token_id and token != tokenizer.unk_token  # an unknown token maps to unk
    return None if found is None or unknown else found


def document_boundary(tokenizer, eos_token_id: int | None = None) -> int:
    """The token that separates documents in pretraining: ``<|endoftext|>`` where the vocabulary has
    it (Qwen, SmolLM2, the tiny pair), else the end-of-sequence token. Qwen's end-of-sequence token is
    ``<|im_end|>``, the end of a chat turn, so it is no document boundary."""
    found = _token_id(tokenizer, DOCUMENT_BOUNDARY)
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    return int(found if found is not None else eos)


def end_of_sequence_tokens(tokenizer, eos_token_id: int | None = None) -> tuple[int, ...]:
    """The tokens an answer ends at by default, ascending: the model's end-of-sequence token and
    its document boundary (Qwen: ``<|endoftext|>`` and ``<|im_end|>``, as its generation config
    lists them; vLLM and llama.cpp stop at the same)."""
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    return tuple(sorted({int(eos), document_boundary(tokenizer, eos)}))


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Prompt token ids: the document boundary (as in pretraining) + the text."""
    return [document_boundary(tokenizer), *tokenizer.encode(text)]


def text_of(tokenizer, tokens) -> str:
    """Tokens as text, special tokens left out (as vLLM and llama.cpp show answers); the token ids
    keep them."""
    return tokenizer.decode(list(tokens), skip_special_tokens=True)


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
        stop_tokens=() if cfg.ignore_eos else end_of_sequence_tokens(pair.tokenizer),
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
    on_token = (lambda toks: on_text(text_of(pair.tokenizer, toks))) if on_text else None
    started = time.perf_counter()
    result = run_decode(pair, cfg, prompt_ids, on_token)
    wall = time.perf_counter() - started
    stats = result.stats.to_dict()
    stats["wall_seconds"] = round(wall, 4)
    stats["tokens_per_second"] = round(len(result.tokens) / wall, 2) if wall > 0 else 0.0
    return {
        "tokens": list(result.tokens),
        "text": text_of(pair.tokenizer, result.tokens),
        "prompt_tokens": prompt_ids,
        "seed": cfg.seed,
        "drafter": cfg.drafter,
        "rule": cfg.rule.value,
        "gamma": cfg.gamma if cfg.drafter != "none" else 0,
        "params": cfg.params.to_dict(),
        "stats": stats,
    }
