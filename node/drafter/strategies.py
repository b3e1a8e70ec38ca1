"""What a drafter peer does with each draft request: honest drafting, or one of the hostile
behaviours used by tests and the demo. None of them can change the target's output; the worst
they can do is cost the target one deadline (slow) or one dropped stream (garbage, flaky, flood).
Every strategy drafts early drafts as well when overlap is on (``DrafterConfig.overlap``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import msgpack

from node.model.decoding import lying_wanted_token
from p2p.messages import MAX_FRAME_BYTES, Draft
from verifier.decode import Proposer
from verifier.model import LanguageModel
from verifier.proposal import MAX_GAMMA
from verifier.proposers import PROPOSERS, build_proposer

STRATEGIES = (
    "honest",
    "lookup",
    "random",
    "adversarial",
    "lying",
    "slow",
    "stall",
    "garbage",
    "flaky",
    "forged",
    "flood",
)
DEFAULT_SLOW_MS = 1000  # well past the target's default draft deadline
FLAKY_MAX_DRAFTS = 3  # a flaky drafter drops its connection after 1..3 drafts
FLOOD_COPIES = 4  # a flooding drafter sends every draft this often (the target allows 2 per message)


@dataclass(frozen=True)
class Behaviour:
    """How to misbehave, decided per session."""

    delay_s: float = 0.0  # slow: sleep before answering
    garbage: bool = False  # send a malformed frame instead of the draft
    drop_after: int | None = None  # flaky: close the connection after this many drafts
    forge_basis: bool = False  # forged: empty answers; early drafts whose basis names a token not emitted
    copies: int = 1  # flood: send every draft this many times
    empty: bool = False  # stall: answer every round with an empty draft (after delay_s: just in time)


def make_proposer(strategy: str, model: LanguageModel, tokenizer, rng_seed: int) -> Proposer:
    """The proposer behind a strategy; ``model`` is this session's own fork of the draft model (the
    adversarial strategy proposes the draft model's least likely token at every position)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}")
    name = strategy if strategy in PROPOSERS and strategy != "garbage" else "honest"  # misbehaviour is on the wire
    lying = lying_wanted_token(tokenizer)
    return build_proposer(name, model, vocab_size=model.vocab_size, lying_token=lying, rng_seed=rng_seed)


def make_behaviour(strategy: str, rng: random.Random, slow_ms: int = DEFAULT_SLOW_MS) -> Behaviour:
    if strategy == "slow":
        return Behaviour(delay_s=slow_ms / 1000)
    if strategy == "stall":
        return Behaviour(delay_s=slow_ms / 1000, empty=True)
    if strategy == "garbage":
        return Behaviour(garbage=True)
    if strategy == "flaky":
        return Behaviour(drop_after=rng.randint(1, FLAKY_MAX_DRAFTS))
    if strategy == "forged":
        return Behaviour(forge_basis=True)
    if strategy == "flood":
        return Behaviour(copies=FLOOD_COPIES)
    return Behaviour()


def forge(draft: Draft, vocab_size: int) -> Draft:
    """The forged strategy's version of a draft: no answer of its own (an empty draft), and early
    drafts of honest tokens whose basis claims the wrong token at its first position. Were the basis
    not checked, those drafts would be used (and credited) whenever the honest basis was right."""
    if not draft.basis:
        return replace(draft, tokens=())
    return replace(draft, basis=((draft.basis[0] + 1) % vocab_size, *draft.basis[1:]))


def _pack(body: object) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def garbage_frames(job: str, start: int, vocab_size: int) -> Sequence[bytes]:
    """Malformed frame bodies a garbage drafter cycles through (each is a complete varint frame
    body except the oversized one, whose length prefix alone exceeds the cap)."""
    draft = {"type": "draft", "job": job, "start": start, "basis": [], "draft_ms": 1.0}
    return [
        b"\xc1\xc1\xc1",  # not msgpack
        _pack([1, 2, 3]),  # not a map
        _pack({**draft, "tokens": [vocab_size]}),  # token id == V
        _pack({**draft, "tokens": [-1, 2]}),
        _pack({**draft, "tokens": list(range(MAX_GAMMA + 1))}),  # longer than any γ
        _pack({**draft, "tokens": [1], "probs": [0.5]}),  # unexpected field
        _pack({"type": "open", "job": job}),  # wrong direction
        _pack({**draft, "job": "x" * 100, "tokens": [1]}),  # job id too long
        _pack({**draft, "tokens": [1], "basis": list(range(start + 1))}),  # basis would begin at k < 0
        _pack({**draft, "start": start + MAX_GAMMA + 2, "tokens": [1], "basis": [1] * (MAX_GAMMA + 2)}),  # > γ+1
        _pack({**draft, "tokens": [1], "draft_ms": float("nan")}),
        _pack({"type": "draft", "job": job, "start": start, "tokens": [1]}),  # a 1.0.0 draft
        b"\x00" * (MAX_FRAME_BYTES + 1),  # oversized
    ]
