"""The trust budget, measured: what it costs to check an answer, to challenge it, and what bond it needs.

Every function here takes measured values (receipts, transactions, timings) and returns plain
JSON-ready dicts for the demo's report. None of them knows whether the answer was speculated:
that is the point, and the report shows the figures side by side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from node.chain.audit import Audit, audit_answer
from node.chain.client import BondClient
from node.chain.receipts import SignedReceipt
from node.model.adapter import HFCausalLM

# Kaplan et al. (2020), "Scaling Laws for Neural Language Models", §2.1: a forward pass costs
# about 2 FLOPs per parameter per scored position (the attention-context term, 2·n_layer·n_ctx·d,
# is left out: it is small at these context lengths).
FLOPS_PER_PARAM_PER_POSITION = 2
AUDIT_REPEATS = 3


def forward_flops_per_position(model: HFCausalLM) -> int:
    """≈ 2·N for a model of N parameters (tied embedding/LM-head weights counted once)."""
    return FLOPS_PER_PARAM_PER_POSITION * model.parameter_count()


def audit_all(model: HFCausalLM, receipts: dict[str, list[dict]], repeats: int = AUDIT_REPEATS) -> dict[str, dict]:
    """Re-execute every receipted answer the way a challenger does (one teacher-forced pass each),
    per mode. Timing: one untimed warm-up audit, then ``repeats`` rounds interleaving the modes;
    each answer's fastest audit counts (the work is identical every time; slower runs are noise)."""
    signed = {mode: [SignedReceipt.from_json(r) for r in rs] for mode, rs in receipts.items()}
    audit_answer(model, next(iter(signed.values()))[0])  # warm-up: first-call allocations
    best: dict[str, list[Audit]] = {}
    for _ in range(repeats):
        for mode, answers in signed.items():
            runs = [audit_answer(model, s) for s in answers]
            previous = best.get(mode, runs)
            best[mode] = [min(a, b, key=lambda x: x.seconds) for a, b in zip(previous, runs, strict=True)]
    return {mode: _summary(audits) for mode, audits in best.items()}


def _summary(audits: list[Audit]) -> dict:
    tokens = sum(a.tokens_checked for a in audits)
    positions = sum(a.target_positions for a in audits)
    return {
        "answers": len(audits),
        "all_correct": all(a.first_wrong is None for a in audits),
        "first_wrong": [a.first_wrong for a in audits],
        "tokens_checked": tokens,
        "target_positions": positions,
        "seconds": round(sum(a.seconds for a in audits), 4),
        "positions_per_token": round(positions / tokens, 4) if tokens else 0.0,
    }


def tx_gas(client: BondClient, tx_hash: str) -> int:
    return int(client.w3.eth.get_transaction_receipt(tx_hash)["gasUsed"])


def resolution(client: BondClient, challenge_id: int) -> dict:
    """The ChallengeResolved event of ``challenge_id``, the gas of its transaction, and the referee
    signatures that transaction carried."""
    matches = [e for e in client.events("ChallengeResolved") if e["id"] == challenge_id]
    if not matches:
        return {"resolved": False, "slashed_wei": 0, "resolve_gas": 0, "referee_signatures": 0}
    event = matches[0]
    _, args = client.contract.decode_function_input(client.w3.eth.get_transaction(event["tx"])["input"])
    return {
        "resolved": True,
        "slashed_wei": int(event["slashed"]),
        "resolve_gas": tx_gas(client, event["tx"]),
        "referee_signatures": len(args["sigs"]),
    }


@dataclass(frozen=True)
class BondSizing:
    """B ≥ g / p: a rational operator does not cheat when the expected slash, p·B, is at least its
    gain g (Becker 1968's deterrence condition, as used for optimistic verification, e.g.
    Teutsch & Reitwießner 2019, "A scalable verification solution for blockchains" (TrueBit)).

    g = the fee of one answer (an operator that skips the target entirely pockets at most that):
    tokens × price. p = audit rate × catch rate, where the catch rate is measured: the share of
    cheating answers that were challenged, resolved at fault and slashed in this run.
    """

    tokens_per_answer: float
    price_wei_per_token: int
    audit_rate: float
    catch_rate: float
    challenge_gas: int
    resolve_gas: int
    audit_seconds_per_answer: float
    gas_price_wei: int

    @property
    def gain_wei(self) -> float:
        return self.tokens_per_answer * self.price_wei_per_token

    @property
    def detection_probability(self) -> float:
        return self.audit_rate * self.catch_rate

    @property
    def min_bond_wei(self) -> float:
        p = self.detection_probability
        return self.gain_wei / p if p > 0 else float("inf")

    @property
    def challenge_cost_wei(self) -> int:
        """What a challenger pays in gas to open a challenge (the referees pay the resolution)."""
        return self.challenge_gas * self.gas_price_wei

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "gain_wei": self.gain_wei,
            "detection_probability": self.detection_probability,
            "min_bond_wei": self.min_bond_wei,
            "challenge_cost_wei": self.challenge_cost_wei,
        }
