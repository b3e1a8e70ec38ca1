"""Re-executing the target for disputes: the challenger's whole-answer check and the referee's one step.

A token is judged by one of two rules, chosen by the model (``judged_exactly``):

- an exact model (node.model.exact: docs/exact-arithmetic.md) computes the same bits on every
  machine and at every pass shape, so a token is correct only when it *is* the target's token
  (``verifier.verify.sample_token``): no band, a runner-up however close is wrong;
- a float model (the ``tiny`` and ``smollm2`` pairs, the packed float16 target) uses the verifier's
  tolerance rule (``verifier.tolerance``): a token is correct when it may have been kept by
  top-k/top-p and its noisy score is within δ logits of the best surely kept one, so float noise
  between machines or between pass shapes never makes an honest answer look wrong (docs/design.md
  §3, §4).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node.chain import ChainError
from node.chain.receipts import RequestSpec, SignedReceipt
from node.model.adapter import HFCausalLM
from verifier.params import SamplingParams
from verifier.tolerance import shortfall, within_tolerance
from verifier.verify import sample_token

TextOf = Callable[[Sequence[int]], str]  # the tokenizer's text of token ids (stop sequences need it)


@dataclass(frozen=True)
class Audit:
    """The challenger's finding: the first wrong position (outside the band, or for an exact model not
    the target's token), or None when every token is right; and whether a right answer stopped early
    (before max_tokens, where its stop rule does not end it), with the token the target would have
    emitted next."""

    first_wrong: int | None
    tokens_checked: int
    target_positions: int  # positions the target scored to check the answer (one pass)
    seconds: float
    margin: float | None  # at first_wrong: how far (logit units) the claimed token's noisy score is below the best
    early_end: bool = False
    next_token: int | None = None  # at an early end: the target's token there, which the answer left out


def stopped_early(request: RequestSpec, output: Sequence[int], text: TextOf | None) -> bool:
    """The answer ended before ``max_tokens`` and its stop rule does not end it there (nor earlier:
    an answer run past its end is a wrong token, not an early end)."""
    return len(output) < request.max_tokens and request.end_of(output, text) is None


def judged_exactly(model: HFCausalLM) -> bool:
    """Whether ``model`` computes one arithmetic's bits everywhere (an exact model names its
    arithmetic), so that its tokens are compared exactly rather than within the band."""
    return getattr(model, "arithmetic", None) is not None


def is_wrong(model: HFCausalLM, logits, params: SamplingParams, seed: int, k: int, token: int) -> bool:
    """Is ``token`` not the target's at position k, given the judge's ``logits`` row ([V])?"""
    if judged_exactly(model):
        return token != sample_token(logits, params, seed, k)
    return not within_tolerance(logits, params, seed, k, token)


def check_model(model_hash: bytes, local_hash: bytes, role: str) -> None:
    if model_hash != local_hash:
        raise ChainError(
            f"the receipt commits to model 0x{model_hash.hex()}, but this {role} has 0x{local_hash.hex()}: "
            "point it at the committed model directory"
        )


def _fits(model: HFCausalLM, context: Sequence[int]) -> None:
    """The context must be re-executable: non-empty, within the window, every id in the vocabulary."""
    if not context:
        raise ChainError("nothing to re-execute: the prompt is empty")
    if any(not 0 <= t < model.vocab_size for t in context):
        raise ChainError(f"the context holds token ids outside the vocabulary of {model.vocab_size}")
    if len(context) > model.max_positions:
        raise ChainError(f"{len(context)} positions exceed the model's context window of {model.max_positions}")


def audit_answer(model: HFCausalLM, signed: SignedReceipt, text: TextOf | None = None) -> Audit:
    """Check every token of a receipted answer against the target, and where it ends.

    This is plain decoding replayed with the answer's own tokens as the context (teacher forcing),
    so the whole answer is scored in one pass, like one speculative verification round whose draft
    is the answer: row k of the logits is what plain decoding would see at token k. An answer that
    stopped early is scored one position further: that row is the token it left out.
    ``text``: the tokenizer's text (needed when the request has stop sequences).
    """
    request = signed.request
    prompt, output = list(request.prompt), list(signed.output)
    params, seed = request.params, request.seed
    bad_ids = [k for k, t in enumerate(output) if not 0 <= t < model.vocab_size]
    checked = output[: bad_ids[0]] if bad_ids else output  # an id outside the vocabulary is wrong as such
    early = not bad_ids and stopped_early(request, output, text)
    context = [*prompt, *checked] if early else [*prompt, *checked[:-1]]
    if not checked and not early:
        return Audit(bad_ids[0] if bad_ids else None, 1 if bad_ids else 0, 0, 0.0, float("inf") if bad_ids else None)
    _fits(model, context)
    started = time.perf_counter()
    model.reset()
    logits = model.extend(context)[len(prompt) - 1 :]  # [len(checked) (+1 at an early end), V]: row k decides token k
    for k, token in enumerate(checked):
        if is_wrong(model, logits[k], params, seed, k, token):
            margin = shortfall(logits[k], params, seed, k, token)
            return Audit(k, k + 1, len(context), time.perf_counter() - started, margin)
    elapsed = time.perf_counter() - started
    if bad_ids:
        return Audit(bad_ids[0], bad_ids[0] + 1, len(context), elapsed, float("inf"))
    if early:
        next_token = sample_token(logits[len(output)], params, seed, len(output))
        return Audit(None, len(output), len(context), elapsed, None, True, int(next_token))
    return Audit(None, len(output), len(context), elapsed, None)


@dataclass(frozen=True)
class Judgement:
    """A referee's verdict on one disputed token and what re-executing that step cost."""

    at_fault: bool  # the disputed token is outside the band: the operator is at fault
    target_positions: int  # positions the target scored (prompt + the output before the position)
    seconds: float


def judge_step(
    model: HFCausalLM, prompt: Sequence[int], output: Sequence[int], position: int, params: SamplingParams, seed: int
) -> Judgement:
    """A referee's verdict on one disputed token: is output[position] outside the band (operator at fault)?

    Only that step is re-executed: the target scores prompt + output[:position] and the last row
    decides. The earlier tokens are taken as given (the receipt commits to them).
    """
    if not 0 <= position < len(output):
        raise ChainError(f"position {position} is outside the output of {len(output)} tokens")
    context = [*prompt, *output[:position]]
    _fits(model, context)
    token = int(output[position])
    if not 0 <= token < model.vocab_size:
        return Judgement(True, 0, 0.0)  # the target can never emit an id outside its vocabulary
    started = time.perf_counter()
    model.reset()
    logits = model.extend(context)[-1]
    at_fault = is_wrong(model, logits, params, seed, position, token)
    return Judgement(at_fault, len(context), time.perf_counter() - started)


def judge_end(model: HFCausalLM, request: RequestSpec, output: Sequence[int], text: TextOf | None) -> Judgement:
    """A referee's verdict on an end challenge (``SpecmarketBond.challengeEnd``): the operator is at
    fault when the answer stopped before ``max_tokens`` where its stop rule does not end it. The
    rule alone decides (an honest answer ends with its stop token, or the token that completes a
    stop sequence); the step after the end is re-executed all the same, the target's token there
    being the one the answer left out."""
    at_fault = stopped_early(request, output, text)
    context = [*request.prompt, *output]
    _fits(model, context)
    started = time.perf_counter()
    model.reset()
    model.extend(context)
    return Judgement(at_fault, len(context), time.perf_counter() - started)
