"""What a client checks before it trusts an answer's receipt (``specmarket ask``).

A receipt is worth something only if a challenge could hold the operator to it. So besides the
signature and hashes (``SignedReceipt.check``), the client checks that the receipt:

- covers exactly the tokens received;
- commits to the request the client made: its own tokenization of the prompt (or of the chat),
  the sampling parameters and max tokens it asked, and its seed (an operator could otherwise
  answer a cheaper request honestly, a shorter prompt or fewer tokens, and sign that);
- was signed in the domain of the deployment the client trusts (chain id and contract);
- names an operator that is registered and active there, bonded for the model the client expects;
- is fresh on the chain's clock (issued at most ``RECEIPT_FRESH_S`` ago, not in the future), so
  nearly its whole challenge window is left.

The chain is read through ``ChainView`` (plain JSON-RPC, node/client/chain_view.py). A client
without the model's files takes the receipt's prompt, stop tokens and model as they are and says so
(node/client/expected.py); everything else is checked all the same.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from node.chain.receipts import CLOCK_SLACK_S, RECEIPT_FRESH_S, ReceiptError, RequestSpec, SignedReceipt
from node.client.chain_view import ChainView
from verifier.params import SamplingParams


@dataclass(frozen=True)
class Asked:
    """The request as the client made it (``seed`` None: the target drew one)."""

    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int | None
    max_tokens: int
    stop_tokens: tuple[int, ...] = ()  # the model's end-of-sequence tokens; () with ignore_eos


def check_covers(signed: SignedReceipt, asked: Asked, tokens: list[int]) -> None:
    """The receipt covers the tokens received and commits to the request made, and the answer ends
    where that request's stop rule ends it (not cut short, not run past a stop token); else ReceiptError."""
    if list(signed.output) != list(tokens):
        raise ReceiptError("the receipt does not cover the tokens received")
    seed = signed.request.seed if asked.seed is None else asked.seed
    expected = RequestSpec.build(asked.prompt, asked.params, seed, asked.max_tokens, asked.stop_tokens)
    if expected.hash() == signed.receipt.request_hash:
        if not expected.ended_by_rule(signed.output):
            raise ReceiptError(
                f"the answer of {len(signed.output)} tokens does not end where its stop rule ends it (at the "
                f"first of {list(expected.stop_tokens)} or at {expected.max_tokens} tokens)"
            )
        return
    differ = [f.name for f in fields(RequestSpec) if getattr(expected, f.name) != getattr(signed.request, f.name)]
    shown = ", ".join(
        f"{name} {getattr(signed.request, name)!r} (asked {getattr(expected, name)!r})"
        if name != "prompt"
        else f"a prompt of {len(signed.request.prompt)} tokens (asked {len(expected.prompt)})"
        for name in differ
    )
    raise ReceiptError(f"the receipt is for another request than the one made: it names {shown or 'other values'}")


def check_on_chain(signed: SignedReceipt, chain: ChainView, model_hash: bytes | None) -> None:
    """The receipt's domain, operator and freshness, against the deployment ``chain`` reads.
    ``model_hash`` None (a client without the model's files): the operator must be bonded for the
    model the receipt names, whichever it is (the caller says that the model was not checked)."""
    if signed.domain != chain.domain:
        raise ReceiptError(
            f"the receipt was signed for chain {signed.domain.chain_id} contract {signed.domain.contract}, not the "
            f"deployment this client trusts (chain {chain.domain.chain_id} contract {chain.domain.contract})"
        )
    r = signed.receipt
    model_hash = r.model_hash if model_hash is None else model_hash
    if r.model_hash != model_hash:
        raise ReceiptError(f"the receipt is for model 0x{r.model_hash.hex()}, not the expected 0x{model_hash.hex()}")
    info = chain.operator_info(r.operator)
    if not info.active or info.model_hash != model_hash:
        state = "bonded for another model"
        if not info.registered or info.unbond_at:
            state = "unbonding" if info.registered else "not registered"
        raise ReceiptError(f"operator {r.operator} is {state} on chain: nobody could hold it to this receipt")
    check_fresh(r.issued_at, chain.now())


def check_fresh(issued_at: int, now: int) -> None:
    """A receipt issued at ``issued_at`` leaves nearly its whole challenge window at chain time ``now``."""
    if issued_at > now + CLOCK_SLACK_S:
        raise ReceiptError(f"the receipt is stamped {issued_at - now} s in the chain's future")
    if now - issued_at > RECEIPT_FRESH_S:
        raise ReceiptError(
            f"the receipt was issued {now - issued_at} s ago on the chain's clock (at most {RECEIPT_FRESH_S} s "
            "is accepted): its challenge window is running out"
        )
