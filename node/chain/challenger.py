"""A challenger: audit a receipted answer and, only if a token is outside the band, challenge it."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from node.chain import ChainError
from node.chain.audit import Audit, TextOf, audit_answer, check_model, judge_step, judged_exactly
from node.chain.client import BondClient
from node.chain.deployment import format_ether
from node.chain.receipts import CLOCK_SLACK_S, ReceiptError, SignedReceipt
from node.model.adapter import HFCausalLM
from p2p import safe_json

log = logging.getLogger(__name__)

MAX_RECEIPT_FILE_BYTES = 4 << 20
CLOCK_WAIT_MARGIN_S = 5.0  # beyond the receipt's lead: the chain's clock ticks in whole seconds


class CertainLoss(ChainError):
    """A challenge the challenger's own re-execution says would fail: the disputed token is inside
    the tolerance band, so the referees would clear the operator and the challenger bond is lost."""


@dataclass(frozen=True)
class ChallengeReport:
    audit: Audit
    challenge_id: int | None  # None: nothing was submitted
    position: int | None
    gas_used: int = 0

    def to_json(self) -> dict:
        a = self.audit
        return {
            "correct": a.first_wrong is None and not a.early_end,
            "first_wrong": a.first_wrong,
            "early_end": a.early_end,
            "next_token": a.next_token,
            "margin": a.margin,
            "tokens_checked": a.tokens_checked,
            "target_positions": a.target_positions,
            "seconds": round(a.seconds, 4),
            "challenge_id": self.challenge_id,
            "position": self.position,
            "gas_used": self.gas_used,
        }


def read_receipt_file(path: Path) -> SignedReceipt:
    """A receipt file (as `specmarket ask --receipt-out` writes it, or an API answer's receipt)."""
    try:
        if path.stat().st_size > MAX_RECEIPT_FILE_BYTES:
            raise ReceiptError(f"{path} is larger than {MAX_RECEIPT_FILE_BYTES} bytes")
        data = safe_json.loads(path.read_text(), f"receipt file {path}")
    except (OSError, ValueError) as exc:
        raise ReceiptError(f"cannot read receipt file {path}: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("specmarket"), dict):  # a whole API answer
        data = data["specmarket"].get("receipt")
    return SignedReceipt.from_json(data)


def check_domain(signed: SignedReceipt, client: BondClient) -> None:
    """A receipt is only challengeable in the deployment it was signed for."""
    if signed.domain != client.domain:
        raise ReceiptError(
            f"the receipt was signed for contract {signed.domain.contract} on chain {signed.domain.chain_id}, "
            f"not for {client.domain.contract} on chain {client.domain.chain_id}"
        )


def challenge_receipt(
    client: BondClient,
    key: bytes,
    model: HFCausalLM,
    model_hash: bytes,
    signed: SignedReceipt,
    *,
    force_position: int | None = None,
    force: bool = False,
    text: TextOf | None = None,
) -> ChallengeReport:
    """Audit ``signed``; submit a challenge at its first wrong token, or at its end when every token is
    right but it stopped early (``challengeEnd``), or spend nothing if it is correct.

    ``force_position`` challenges that position instead. Where the token there is inside the band,
    that challenge is certain to fail and is refused (``CertainLoss``) before anything is sent,
    unless ``force`` (a deliberately false challenge, for tests and the demo: it loses its bond).
    ``text``: the tokenizer's text, to judge where stop sequences end an answer.
    """
    signed.check()
    check_domain(signed, client)
    check_model(signed.receipt.model_hash, model_hash, "challenger")
    audit = audit_answer(model, signed, text)
    position = audit.first_wrong if force_position is None else force_position
    if position is None and audit.early_end:
        wait_until_issued(client, signed)
        challenge_id, tx = client.challenge_end(key, signed)
        log.info(
            "end challenge %d opened: the answer stopped after %d of at most %d tokens where its stop rule does "
            "not end it (the target's next token: %s; gas %d)",
            challenge_id, len(signed.output), signed.request.max_tokens, audit.next_token, tx.gas_used,
        )  # fmt: skip
        return ChallengeReport(audit, challenge_id, len(signed.output), tx.gas_used)
    if position is None:
        rule = "are the target's own" if judged_exactly(model) else "are within the tolerance band"
        log.info("receipt correct: all %d tokens %s; nothing submitted", audit.tokens_checked, rule)
        return ChallengeReport(audit, None, None)
    if not 0 <= position < len(signed.output):
        raise ChainError(f"position {position} is outside the answer's {len(signed.output)} tokens")
    if position != audit.first_wrong and not force:
        refuse_certain_loss(client, model, signed, position)
    wait_until_issued(client, signed)
    challenge_id, tx = client.challenge(key, signed, position)
    log.info("challenge %d opened at position %d (gas %d)", challenge_id, position, tx.gas_used)
    return ChallengeReport(audit, challenge_id, position, tx.gas_used)


def wait_until_issued(client: BondClient, signed: SignedReceipt) -> None:
    """Wait for the chain's clock to reach the receipt's ``issued_at``.

    The contract refuses a challenge against a receipt from its future (``ReceiptFromFuture``), and
    an honest operator whose clock runs a little ahead stamps exactly such receipts. Clients accept
    them up to ``CLOCK_SLACK_S`` ahead, so the challenger waits that long at most rather than revert.
    """
    issued_at = signed.receipt.issued_at
    lead = issued_at - client.chain_time()
    if lead <= 0:
        return
    if lead > CLOCK_SLACK_S:
        raise ReceiptError(
            f"the receipt is stamped {lead} s ahead of the chain's clock (more than the {CLOCK_SLACK_S} s "
            "a client accepts); the contract refuses to judge it until then, so nothing was sent"
        )
    log.info("the receipt is stamped %d s ahead of the chain's clock; waiting for the chain to reach it", lead)
    if not client.wait_for_time(issued_at, lead + CLOCK_WAIT_MARGIN_S):
        raise ChainError(f"the chain's clock did not reach the receipt's time {issued_at}; nothing was sent")


def refuse_certain_loss(client: BondClient, model: HFCausalLM, signed: SignedReceipt, position: int) -> None:
    """Raise ``CertainLoss`` when the referees would clear the token at ``position`` (they judge
    that one step, taking the tokens before it as given)."""
    request = signed.request
    if judge_step(model, request.prompt, signed.output, position, request.params, request.seed).at_fault:
        return
    bond = format_ether(client.config().challenger_bond)
    raise CertainLoss(
        f"the token at position {position} is inside the tolerance band, so a challenge there is certain to fail "
        f"and lose the challenger bond of {bond}; nothing was sent (--force submits it anyway)"
    )


OUTCOMES = {2: "operator at fault", 3: "operator cleared", 4: "expired (refunded)"}  # by ChallengeStatus


def wait_for_outcome(client, key: bytes, challenge_id: int, wait_s: float) -> str:
    """Wait for the referees (or the timeout); withdraw whatever the challenger was credited."""
    from eth_account import Account

    outcome = OUTCOMES.get(client.wait_closed(challenge_id, wait_s), "still open")

    if client.credits(Account.from_key(key).address):
        tx = client.withdraw(key)
        (event,) = client.decode_events(tx, "Withdrawn")
        outcome += f"; withdrew {format_ether(event['amount'])}"
    return outcome
