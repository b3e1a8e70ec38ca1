"""SpecmarketBond over JSON-RPC (web3.py 8): deploy, bond, challenge, resolve, withdraw, read events.

Transactions are signed locally with the caller's key and sent raw; a revert comes back as a
``ChainRevert`` naming the contract's custom error and its arguments.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from eth_abi import decode as abi_decode
from eth_account import Account
from eth_utils import function_abi_to_4byte_selector, to_checksum_address
from web3 import HTTPProvider, Web3
from web3.exceptions import (
    ContractCustomError,
    ContractLogicError,
    TransactionNotFound,
    Web3Exception,
    Web3RPCError,
)
from web3.logs import DISCARD

from node.chain import ChainError
from node.chain.deployment import BondConfig, Deployment, load_artifact
from node.chain.receipts import Domain, Receipt, SignedReceipt
from node.runtime.redact import redact, shown_url

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 30.0
TX_TIMEOUT_S = 60.0
WAIT_POLL_S = 0.5
MINED_POLL_S = 0.05  # a dev chain mines at once
GAS_MARGIN_PCT = 120  # gas limit = estimate + 20%; what a call really used is in TxResult.gas_used
TRANSFER_GAS = 21_000
NONCE_ATTEMPTS = 8  # sends of one transaction when other processes share the sender's account
NONCE_RETRY_PAUSE_S = 0.1  # the random pause before attempt k is at most k times this
NONCE_RACE_MARKERS = ("nonce too low", "replacement transaction underpriced")


class ChainRevert(ChainError):
    """A call or transaction the contract reverted; ``name`` is its custom error."""

    def __init__(self, name: str, args: dict[str, Any], action: str) -> None:
        self.name, self.args = name, args
        shown = ", ".join(f"{k}={_show(v)}" for k, v in args.items())
        super().__init__(f"{action} reverted: {name}({shown})")


def _show(value: Any) -> str:
    return "0x" + value.hex() if isinstance(value, bytes) else str(value)


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


@dataclass(frozen=True)
class TxResult:
    tx_hash: str
    gas_used: int
    block: int
    logs: tuple[Any, ...]


def connect(rpc: str) -> Web3:
    w3 = Web3(HTTPProvider(rpc, request_kwargs={"timeout": RPC_TIMEOUT_S}))
    try:
        w3.eth.chain_id  # noqa: B018  (fails fast when nothing answers)
    except (OSError, Web3Exception) as exc:
        raise ChainError(f"no Ethereum JSON-RPC endpoint answers at {shown_url(rpc)} ({type(exc).__name__})") from exc
    return w3


class BondClient:
    """One SpecmarketBond deployment, reached through one RPC endpoint."""

    def __init__(self, w3: Web3, address: str, abi: list[dict] | None = None) -> None:
        self.w3 = w3
        self.address = to_checksum_address(address)
        self.abi = abi if abi is not None else load_artifact()[0]
        if not w3.eth.get_code(self.address):
            raise ChainError(f"no contract at {self.address} on chain {w3.eth.chain_id}: deploy it first")
        self.contract = w3.eth.contract(address=self.address, abi=self.abi)
        self._errors = {
            function_abi_to_4byte_selector(e): e for e in self.abi if e["type"] == "error"
        }  # selector -> error ABI
        self.domain = Domain(int(w3.eth.chain_id), self.address)

    @classmethod
    def from_deployment(cls, rpc: str, deployment: Deployment) -> BondClient:
        w3 = connect(rpc)
        if w3.eth.chain_id != deployment.chain_id:
            raise ChainError(
                f"{shown_url(rpc)} is chain {w3.eth.chain_id}, the deployment is for chain {deployment.chain_id}"
            )
        return cls(w3, deployment.address)

    # ---------------------------------------------------------------- errors and transactions

    def _revert(self, exc: ContractLogicError, action: str) -> ChainError:
        data = exc.data if isinstance(exc.data, str) else ""
        raw = bytes.fromhex(data[2:]) if data.startswith("0x") else b""
        error = self._errors.get(raw[:4])
        if error is None:
            return ChainError(f"{action} reverted: {exc.message or exc}")
        types = [i["type"] if i["type"] != "tuple" else _tuple_type(i) for i in error["inputs"]]
        values = abi_decode(types, raw[4:])
        return ChainRevert(error["name"], dict(zip([i["name"] for i in error["inputs"]], values, strict=True)), action)

    def call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.contract.functions, fn)(*args).call()
        except ContractCustomError as exc:
            raise self._revert(exc, fn) from None
        except ContractLogicError as exc:
            raise ChainError(f"{fn} reverted: {exc.message or exc}") from None

    def send(self, key: bytes | str, fn: str, *args: Any, value: int = 0) -> TxResult:
        """Sign and send ``fn(*args)`` from ``key``'s account; wait for it to be mined."""
        sender = Account.from_key(key)
        call = getattr(self.contract.functions, fn)(*args)
        params = {
            "from": sender.address,
            "value": value,
            "nonce": self.w3.eth.get_transaction_count(sender.address, "pending"),
            "chainId": self.domain.chain_id,
        }
        try:
            # estimated against the block it will be mined in (its timestamp is "now", while the
            # latest block may be minutes old on an idle dev chain): a revert surfaces here, before
            # anything is spent
            params["gas"] = call.estimate_gas(params, block_identifier="pending") * GAS_MARGIN_PCT // 100
            tx = call.build_transaction(params)
        except ContractCustomError as exc:
            raise self._revert(exc, fn) from None
        except ContractLogicError as exc:
            raise ChainError(f"{fn} reverted: {exc.message or exc}") from None
        return _send_signed(self.w3, sender, tx, fn)

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

    def chain_time(self) -> int:
        """Now on the chain's clock: the timestamp of the block a transaction sent now lands in."""
        return int(self.w3.eth.get_block("pending")["timestamp"])

    def wait_for_time(self, ts: int, timeout_s: float, poll_s: float = WAIT_POLL_S) -> bool:
        """Whether the chain's clock reached unix time ``ts`` within ``timeout_s``."""
        deadline, pause = time.monotonic() + timeout_s, threading.Event()
        while (now := self.chain_time()) < ts and time.monotonic() < deadline:
            pause.wait(min(poll_s, ts - now))
        return self.chain_time() >= ts

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

    def events(
        self, name: str, from_block: int = 0, to_block: int | str = "latest", **filters: Any
    ) -> list[dict[str, Any]]:
        """Decoded ``name`` events of this contract: each its args plus block (number and hash) and tx hash."""
        event = getattr(self.contract.events, name)
        logs = event.get_logs(from_block=from_block, to_block=to_block, argument_filters=filters or None)
        return [
            {
                **dict(e["args"]),
                "block": e["blockNumber"],
                "block_hash": e["blockHash"].to_0x_hex(),
                "tx": e["transactionHash"].to_0x_hex(),
            }
            for e in logs
        ]

    def decode_events(self, tx: TxResult, name: str) -> list[dict[str, Any]]:
        event = getattr(self.contract.events, name)
        return [dict(e["args"]) for e in event().process_receipt({"logs": list(tx.logs)}, errors=DISCARD)]

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


def _tuple_type(abi_input: dict) -> str:
    return "(" + ",".join(c["type"] for c in abi_input["components"]) + ")"


def transfer(w3: Web3, key: bytes | str, to: str, value: int) -> TxResult:
    """Send ``value`` wei from ``key``'s account to ``to``; wait for it to be mined."""
    sender = Account.from_key(key)
    tx = {
        "to": to_checksum_address(to),
        "value": value,
        "gas": TRANSFER_GAS,
        "gasPrice": w3.eth.gas_price,
        "nonce": w3.eth.get_transaction_count(sender.address, "pending"),
        "chainId": int(w3.eth.chain_id),
    }
    return _send_signed(w3, sender, tx, "transfer")


def _send_signed(w3: Web3, sender, tx: dict, action: str) -> TxResult:
    """Sign, send, wait. When another process sent from the same account between our nonce read and
    our send (several target nodes funded from anvil's account 0 at once), the node answers "nonce
    too low" or "replacement transaction underpriced" and nothing was sent, or it took the other
    transaction in place of ours (a higher fee replaces one with the same nonce): re-read the
    nonce and send again, a few times, after a short random pause."""
    for attempt in range(1, NONCE_ATTEMPTS + 1):
        try:
            tx_hash = w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
        except Web3RPCError as exc:
            if attempt == NONCE_ATTEMPTS or not _nonce_race(exc):
                raise ChainError(f"{action}: the node refused the transaction: {redact(str(exc))}") from None
            log.debug("%s: nonce %d was taken (%s); retrying", action, tx["nonce"], exc)
        else:
            receipt = _wait_mined(w3, tx_hash, sender.address, tx["nonce"], action)
            if receipt is not None:
                break
            log.debug("%s: nonce %d went to another transaction of %s; resending", action, tx["nonce"], sender.address)
        time.sleep(random.uniform(0.0, NONCE_RETRY_PAUSE_S * attempt))
        tx = {**tx, "nonce": w3.eth.get_transaction_count(sender.address, "pending")}
    else:
        raise ChainError(f"{action}: every one of {NONCE_ATTEMPTS} sends lost its nonce to another transaction")
    if receipt["status"] != 1:
        raise ChainError(f"{action}: transaction {tx_hash.to_0x_hex()} failed on chain")
    log.debug("%s mined in block %d, gas %d", action, receipt["blockNumber"], receipt["gasUsed"])
    return TxResult(tx_hash.to_0x_hex(), int(receipt["gasUsed"]), int(receipt["blockNumber"]), tuple(receipt["logs"]))


def _wait_mined(w3: Web3, tx_hash, sender: str, nonce: int, action: str):
    """The transaction's receipt once mined; None when another transaction of ``sender`` was mined
    with its nonce (ours was replaced and will never be)."""
    deadline = time.monotonic() + TX_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(TransactionNotFound):
            return w3.eth.get_transaction_receipt(tx_hash)
        if w3.eth.get_transaction_count(sender, "latest") > nonce:  # the nonce is used: by us, or not
            with contextlib.suppress(TransactionNotFound):
                return w3.eth.get_transaction_receipt(tx_hash)
            return None
        time.sleep(MINED_POLL_S)
    raise ChainError(f"{action}: transaction {tx_hash.to_0x_hex()} was not mined in {TX_TIMEOUT_S:.0f} s")


def _nonce_race(exc: Web3RPCError) -> bool:
    message = str(exc).lower()
    return any(marker in message for marker in NONCE_RACE_MARKERS)


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
    result = _send_signed(w3, deployer, tx, "deploy")
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
