"""SpecmarketBond over JSON-RPC: deploy, bond, challenge, resolve, withdraw, read events.

The transaction machinery (signing, sending, revert decoding) is node.chain.contract's.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass
from typing import Any

from eth_account import Account
from eth_utils import to_checksum_address
from web3 import Web3
from web3.exceptions import ContractLogicError

from node.chain import ChainError
from node.chain.contract import WAIT_POLL_S, ChainRevert, ContractClient, TxResult, connect, send_signed, transfer
from node.chain.deployment import BondConfig, Deployment, load_artifact
from node.chain.receipts import Receipt, SignedReceipt

__all__ = ["BondClient", "ChainRevert", "ChallengeStatus", "OperatorInfo", "TxResult", "connect", "deploy", "transfer"]


# SpecmarketBond.Challenge, in order
CHALLENGE_FIELDS = (
    "challenger",
    "bond",
    "operator",
    "created_at",
    "position",
    "status",
    "receipt_digest",
    "referee_epoch",
)


class ChallengeStatus(enum.IntEnum):
    """SpecmarketBond.ChallengeStatus."""

    NONE = 0
    OPEN = 1
    OPERATOR_AT_FAULT = 2
    OPERATOR_CLEARED = 3
    EXPIRED = 4


@dataclass(frozen=True)
class OperatorInfo:
    registered: bool
    active: bool
    model_hash: bytes
    bond: int
    unbond_at: int
    open_challenges: int


class BondClient(ContractClient):
    """One SpecmarketBond deployment, reached through one RPC endpoint."""

    # ---------------------------------------------------------------- views

    def operator_info(self, operator: str) -> OperatorInfo:
        return OperatorInfo(*self.call("operatorInfo", to_checksum_address(operator)))

    def config(self) -> BondConfig:
        names = BondConfig.__dataclass_fields__
        return BondConfig(**{name: self.call(_camel(name)) for name in names})

    def credits(self, account: str) -> int:
        return self.call("credits", to_checksum_address(account))

    def challenge_record(self, challenge_id: int) -> dict[str, Any]:
        return dict(zip(CHALLENGE_FIELDS, self.call("getChallenge", challenge_id), strict=True))

    def challenge_status(self, challenge_id: int) -> ChallengeStatus:
        return ChallengeStatus(self.challenge_record(challenge_id)["status"])

    def wait_closed(self, challenge_id: int, timeout_s: float, poll_s: float = WAIT_POLL_S) -> ChallengeStatus:
        """The challenge's status once it is no longer open (resolved or refunded), or OPEN after ``timeout_s``."""
        deadline, pause = time.monotonic() + timeout_s, threading.Event()
        while (status := self.challenge_status(challenge_id)) is ChallengeStatus.OPEN and time.monotonic() < deadline:
            pause.wait(poll_s)
        return status

    def referees(self) -> list[str]:
        """The current epoch's referees."""
        return list(self.call("referees"))

    def threshold(self) -> int:
        """The current epoch's verdict threshold."""
        return self.call("threshold")

    def referee_epoch(self) -> int:
        return self.call("refereeEpoch")

    def referees_at(self, epoch: int) -> list[str]:
        """The referees of ``epoch`` (a challenge is decided by the epoch it opened in)."""
        return list(self.call("refereesAt", epoch))

    def threshold_at(self, epoch: int) -> int:
        return self.call("thresholdAt", epoch)

    def pending_referee_set(self) -> tuple[list[str], int, int] | None:
        """The owner's proposed next referee set: (members, threshold, eta), or None."""
        members, threshold, eta = self.call("pendingRefereeSet")
        return (list(members), int(threshold), int(eta)) if eta else None

    def receipt_digest(self, receipt: Receipt) -> bytes:
        return bytes(self.call("receiptDigest", receipt.as_tuple()))

    def receipt_signer(self, receipt: Receipt, signature: bytes) -> str:
        return self.call("receiptSigner", receipt.as_tuple(), signature)

    # ---------------------------------------------------------------- actions

    def register(self, key: bytes | str, model_hash: bytes, bond: int) -> TxResult:
        return self.send(key, "register", model_hash, value=bond)

    def challenge(self, key: bytes | str, signed: SignedReceipt, position: int) -> tuple[int, TxResult]:
        """Open a wrong-token challenge at ``position``, posting the configured challenger bond."""
        bond = self.call("challengerBond")
        tx = self.send(
            key,
            "challenge",
            signed.receipt.as_tuple(),
            signed.signature,
            list(signed.request.prompt),
            signed.request.params_tuple(),
            list(signed.output),
            position,
            value=bond,
        )
        (opened,) = self.decode_events(tx, "ChallengeOpened")
        return int(opened["id"]), tx

    def challenge_end(self, key: bytes | str, signed: SignedReceipt) -> tuple[int, TxResult]:
        """Open an end challenge (the answer stopped early), posting the configured challenger bond."""
        request = signed.request
        tx = self.send(
            key,
            "challengeEnd",
            signed.receipt.as_tuple(),
            signed.signature,
            list(request.prompt),
            request.params_tuple(),
            list(signed.output),
            (list(request.stop_tokens), list(request.stop_sequences)),
            value=self.call("challengerBond"),
        )
        (opened,) = self.decode_events(tx, "ChallengeOpened")
        return int(opened["id"]), tx

    def end_rule(self, challenge_id: int, block: int) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
        """The stop rule an end challenge named (its ``EndChallenged`` event, in the block that opened
        it); None for a wrong-token challenge."""
        for event in self.events("EndChallenged", from_block=block, to_block=block, id=challenge_id):
            stop = event["stop"]
            tokens, sequences = (stop["tokens"], stop["sequences"]) if hasattr(stop, "keys") else stop
            return tuple(int(t) for t in tokens), tuple(str(s) for s in sequences)
        return None

    def resolve(self, key: bytes | str, challenge_id: int, at_fault: bool, sigs: dict[str, bytes]) -> TxResult:
        """Submit a verdict with referee signatures keyed by signer (sent in ascending signer order)."""
        ordered = [sigs[a] for a in sorted(sigs, key=lambda a: int(a, 16))]
        return self.send(key, "resolve", challenge_id, at_fault, ordered)

    def slash_equivocation(self, key: bytes | str, a: SignedReceipt, b: SignedReceipt) -> TxResult:
        return self.send(key, "slashEquivocation", a.receipt.as_tuple(), a.signature, b.receipt.as_tuple(), b.signature)

    def withdraw(self, key: bytes | str) -> TxResult:
        return self.send(key, "withdraw")

    def propose_referee_set(self, owner_key: bytes | str, members: list[str], threshold: int) -> dict[str, Any]:
        """Owner: propose the next referee epoch; it can be activated after the contract's
        ``refereeSetDelay``. The ``RefereeSetProposed`` event's args."""
        tx = self.send(owner_key, "proposeRefereeSet", [to_checksum_address(m) for m in members], threshold)
        (event,) = self.decode_events(tx, "RefereeSetProposed")
        return event

    def activate_referee_set(self, key: bytes | str) -> dict[str, Any]:
        """Anyone: make the proposed set the new epoch once its delay has passed (``RefereeSetActivated``)."""
        (event,) = self.decode_events(self.send(key, "activateRefereeSet"), "RefereeSetActivated")
        return event


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def deploy(
    w3: Web3, deployer_key: bytes | str, config: BondConfig, referees: list[str], threshold: int
) -> tuple[Deployment, TxResult]:
    """Deploy a new SpecmarketBond owned by the deployer; the Deployment record and the tx."""
    abi, bytecode = load_artifact()
    deployer = Account.from_key(deployer_key)
    factory = w3.eth.contract(abi=abi, bytecode=bytecode)
    args = (deployer.address, config.as_tuple(), [to_checksum_address(r) for r in referees], threshold)
    try:
        tx = factory.constructor(*args).build_transaction(
            {"from": deployer.address, "nonce": w3.eth.get_transaction_count(deployer.address, "pending")}
        )
    except ContractLogicError as exc:
        raise ChainError(f"deploying SpecmarketBond reverted: {exc.data or exc}") from None
    result = send_signed(w3, deployer, tx, "deploy")
    address = w3.eth.get_transaction_receipt(result.tx_hash)["contractAddress"]
    deployment = Deployment(
        chain_id=int(w3.eth.chain_id),
        address=to_checksum_address(address),
        block=result.block,
        deployer=deployer.address,
        config=config,
        referees=tuple(to_checksum_address(r) for r in referees),
        threshold=threshold,
    )
    return deployment, result
