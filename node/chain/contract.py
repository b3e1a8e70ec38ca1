"""A deployed contract over JSON-RPC (web3.py 8): calls, locally signed transactions, events.

Transactions are signed locally with the caller's key and sent raw; a revert comes back as a
``ChainRevert`` naming the contract's custom error and its arguments.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Self

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
from node.chain.deployment import Deployment, load_artifact
from node.chain.receipts import Domain
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
    """A call or transaction the contract reverted; ``name`` is its custom error, ``values`` its
    arguments by name."""

    def __init__(self, name: str, values: dict[str, Any], action: str) -> None:
        shown = ", ".join(f"{k}={_show(v)}" for k, v in values.items())
        super().__init__(f"{action} reverted: {name}({shown})")
        self.name, self.values = name, values


def _show(value: Any) -> str:
    return "0x" + value.hex() if isinstance(value, bytes) else str(value)


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


class ContractClient:
    """One deployed contract, reached through one RPC endpoint: calls, transactions, revert
    decoding, events. ``artifact`` names the compiled contract (contracts/out) whose ABI it uses."""

    artifact = "SpecmarketBond"

    def __init__(self, w3: Web3, address: str, abi: list[dict] | None = None) -> None:
        self.w3 = w3
        self.address = to_checksum_address(address)
        self.abi = abi if abi is not None else load_artifact(self.artifact)[0]
        if not w3.eth.get_code(self.address):
            raise ChainError(f"no contract at {self.address} on chain {w3.eth.chain_id}: deploy it first")
        self.contract = w3.eth.contract(address=self.address, abi=self.abi)
        self._errors = {
            function_abi_to_4byte_selector(e): e for e in self.abi if e["type"] == "error"
        }  # selector -> error ABI
        self.domain = Domain(int(w3.eth.chain_id), self.address)

    @classmethod
    def from_deployment(cls, rpc: str, deployment: Deployment) -> Self:
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
        decoded = zip(types, abi_decode(types, raw[4:]), strict=True)
        values = [to_checksum_address(v) if t == "address" else v for t, v in decoded]
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
        return send_signed(self.w3, sender, tx, fn)

    # ---------------------------------------------------------------- views

    def chain_time(self) -> int:
        """Now on the chain's clock: the timestamp of the block a transaction sent now lands in."""
        return int(self.w3.eth.get_block("pending")["timestamp"])

    def wait_for_time(self, ts: int, timeout_s: float, poll_s: float = WAIT_POLL_S) -> bool:
        """Whether the chain's clock reached unix time ``ts`` within ``timeout_s``."""
        deadline, pause = time.monotonic() + timeout_s, threading.Event()
        while (now := self.chain_time()) < ts and time.monotonic() < deadline:
            pause.wait(min(poll_s, ts - now))
        return self.chain_time() >= ts

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
    return send_signed(w3, sender, tx, "transfer")


def send_signed(w3: Web3, sender, tx: dict, action: str) -> TxResult:
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
