"""The chain as `specmarket ask` reads it to trust a receipt: three JSON-RPC reads over the standard
library (the chain id, the operator's standing, the pending block's time), without web3.py, whose
import alone costs half a second, nor the contract's compiled artifact.

The deployment the client trusts is the one recorded for the chain's id in its deployments folder
(``Deployment.load``), as for every other command. ``OPERATOR_INFO`` is SpecmarketBond's
``operatorInfo(address)`` view, its selector and return types written out here (a test checks them
against the compiled ABI and a real chain).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_abi.exceptions import DecodingError
from eth_utils import keccak, to_checksum_address

from node.chain import ChainError
from node.chain.deployment import Deployment
from node.chain.receipts import Domain
from node.runtime.redact import shown_url
from p2p import safe_json

log = logging.getLogger(__name__)

RPC_TIMEOUT_S = 10.0
MAX_RPC_BYTES = 1 << 20
OPERATOR_INFO = "operatorInfo(address)"
OPERATOR_INFO_TYPES = ("bool", "bool", "bytes32", "uint256", "uint256", "uint256")


class ChainUnreachable(ChainError):
    """No JSON-RPC endpoint answers at the client's RPC URL."""


@dataclass(frozen=True)
class Standing:
    """An operator's standing in the bond contract (``operatorInfo``)."""

    registered: bool
    active: bool
    model_hash: bytes
    bond: int
    unbond_at: int
    open_challenges: int


def rpc_call(rpc: str, method: str, params: list[Any], timeout_s: float = RPC_TIMEOUT_S) -> Any:
    """One JSON-RPC call's result; ChainUnreachable when nothing answers, ChainError for an error answer."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    try:
        request = urllib.request.Request(rpc, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            answer = safe_json.loads(resp.read(MAX_RPC_BYTES), f"the answer to {method}")
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: not JSON, or no http(s) URL
        reason = getattr(exc, "reason", None) or type(exc).__name__
        raise ChainUnreachable(f"no Ethereum JSON-RPC endpoint answers at {shown_url(rpc)} ({reason})") from exc
    if not isinstance(answer, dict) or ("result" not in answer and "error" not in answer):
        raise ChainUnreachable(f"{shown_url(rpc)} does not answer JSON-RPC ({method})")
    if "error" in answer:
        error = answer["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise ChainError(f"{method} at {shown_url(rpc)} failed: {message!s:.200}")
    return answer["result"]


def _quantity(value: Any, what: str) -> int:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise ChainError(f"{what} is not a hex quantity: {value!r:.80}")
    try:
        return int(value, 16)
    except ValueError as exc:
        raise ChainError(f"{what} is not a hex quantity: {value!r:.80}") from exc


@dataclass(frozen=True)
class ChainView:
    """The deployment the client trusts on the chain at ``rpc``, read through plain JSON-RPC."""

    rpc: str
    domain: Domain  # the chain's id and the trusted SpecmarketBond's address

    @classmethod
    def connect(cls, rpc: str, deployments: Path) -> ChainView:
        """ChainUnreachable when nothing answers at ``rpc``; ChainError when no deployment is recorded."""
        chain_id = _quantity(rpc_call(rpc, "eth_chainId", []), "eth_chainId")
        address = to_checksum_address(Deployment.load(deployments, chain_id).address)
        return cls(rpc, Domain(chain_id, address))

    def operator_info(self, operator: str) -> Standing:
        data = keccak(text=OPERATOR_INFO)[:4] + abi_encode(["address"], [to_checksum_address(operator)])
        call = {"to": to_checksum_address(self.domain.contract), "data": "0x" + data.hex()}
        raw = rpc_call(self.rpc, "eth_call", [call, "latest"])
        try:
            values = abi_decode(OPERATOR_INFO_TYPES, bytes.fromhex(str(raw).removeprefix("0x")))
        except (DecodingError, ValueError) as exc:  # "0x": no contract at the deployment's address
            raise ChainError(
                f"the contract at {self.domain.contract} on chain {self.domain.chain_id} does not answer "
                f"{OPERATOR_INFO} (is the deployment file current?)"
            ) from exc
        return Standing(*values)

    def now(self) -> int:
        """The chain's time: the pending block's timestamp (what a challenge is checked against)."""
        block = rpc_call(self.rpc, "eth_getBlockByNumber", ["pending", False])
        if not isinstance(block, dict):
            raise ChainError(f"{shown_url(self.rpc)} has no pending block")
        return _quantity(block.get("timestamp"), "the pending block's timestamp")
