"""EIP-712 drafter vouchers, byte-compatible with contracts/src/DrafterEscrow.sol.

A voucher is the operator's signed promise that ``drafter`` has earned ``cumulative_wei`` in all
from ``operator`` on one *lane*: each new voucher supersedes the last on its lane, and
``DrafterEscrow.redeem`` pays, out of that lane only, the difference between it and what the lane
has paid so far. A lane is funds the operator set aside for one drafter, counted over (chain,
escrow, operator, drafter, lane): every ledger of an operator has a lane id of its own
(market.ledger), so two ledgers under one key never count over the same total. Cumulative vouchers are the payment
channels of Filecoin's retrieval market and Lightning: a lost or replayed voucher costs nothing,
because only the newest one matters and an older one pays nothing.

Typed data: ``Voucher(address operator,address drafter,uint64 lane,uint256 cumulativeWei,uint64 issuedAt)``
in the domain ("SpecmarketDrafterEscrow", "2", chainId, escrow). ``issued_at`` is informational (the
contract does not check it): a cumulative voucher never expires.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from eth_utils import to_checksum_address

from node.chain.receipts import (
    MAX_U64,
    SIGNATURE_BYTES,
    Domain,
    ReceiptError,
    account_module,
    check_address,
    check_uint,
    recover_signer,
    typed_signable,
)

ESCROW_EIP712_NAME = "SpecmarketDrafterEscrow"
ESCROW_EIP712_VERSION = "2"  # 2: lanes
MAX_U256 = (1 << 256) - 1
MAX_VOUCHER_BYTES = 1024  # a voucher as JSON is ~450 bytes; a network message with more is refused
VOUCHER_FORMAT = 2  # 2: the lane
VOUCHER_TYPES = {
    "Voucher": [
        {"name": "operator", "type": "address"},
        {"name": "drafter", "type": "address"},
        {"name": "lane", "type": "uint64"},
        {"name": "cumulativeWei", "type": "uint256"},
        {"name": "issuedAt", "type": "uint64"},
    ]
}


class VoucherError(ReceiptError):
    """A voucher whose fields or signature do not hold together."""


def escrow_domain(chain_id: int, escrow: str) -> Domain:
    """The EIP-712 domain of one DrafterEscrow deployment."""
    return Domain(chain_id, to_checksum_address(escrow), ESCROW_EIP712_NAME, ESCROW_EIP712_VERSION)


@dataclass(frozen=True)
class Voucher:
    operator: str
    drafter: str
    lane: int  # the operator's lane for this drafter (uint64): totals are counted per lane
    cumulative_wei: int
    issued_at: int

    def as_tuple(self) -> tuple[str, str, int, int, int]:
        """The contract's ``Voucher`` struct."""
        return (
            to_checksum_address(self.operator),
            to_checksum_address(self.drafter),
            self.lane,
            self.cumulative_wei,
            self.issued_at,
        )

    def message(self) -> dict[str, Any]:
        names = [field["name"] for field in VOUCHER_TYPES["Voucher"]]
        return dict(zip(names, self.as_tuple(), strict=True))


@dataclass(frozen=True)
class SignedVoucher:
    """A voucher, its signature and the escrow (domain) it is redeemed at."""

    domain: Domain
    voucher: Voucher
    signature: bytes

    def signer(self) -> str:
        """The address that signed it (canonical low-s signatures only, as the contract requires)."""
        return recover_signer(self.domain, VOUCHER_TYPES, self.voucher.message(), self.signature, VoucherError)

    def check(self) -> None:
        """Raise VoucherError unless the voucher's operator signed it."""
        signer = self.signer()
        if signer != to_checksum_address(self.voucher.operator):
            raise VoucherError(f"the voucher is signed by {signer}, not by its operator {self.voucher.operator}")

    def to_json(self) -> dict[str, Any]:
        v = self.voucher
        return {
            "format": VOUCHER_FORMAT,
            "chain_id": self.domain.chain_id,
            "escrow": to_checksum_address(self.domain.contract),
            "operator": to_checksum_address(v.operator),
            "drafter": to_checksum_address(v.drafter),
            "lane": v.lane,
            "cumulative_wei": str(v.cumulative_wei),  # a decimal string: JSON numbers lose precision past 2**53
            "issued_at": v.issued_at,
            "signature": "0x" + self.signature.hex(),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def loads(cls, text: str) -> SignedVoucher:
        """Parse an untrusted voucher (a network message, a file); the signature is not checked here."""
        if len(text.encode()) > MAX_VOUCHER_BYTES:
            raise VoucherError(f"a voucher is at most {MAX_VOUCHER_BYTES} bytes")
        try:
            return cls.from_json(json.loads(text))
        except json.JSONDecodeError as exc:
            raise VoucherError(f"a voucher is not JSON: {exc}") from None

    @classmethod
    def from_json(cls, data: Any) -> SignedVoucher:
        try:
            if data.get("format") != VOUCHER_FORMAT:
                raise VoucherError(f"unknown voucher format {data.get('format')!r} (expected {VOUCHER_FORMAT})")
            sig = data["signature"]
            if not isinstance(sig, str) or not sig.startswith("0x") or len(sig) != 2 + 2 * SIGNATURE_BYTES:
                raise VoucherError(f"signature must be 0x + {SIGNATURE_BYTES} bytes of hex")
            wei = data["cumulative_wei"]
            if not isinstance(wei, str) or not wei.isdigit() or not 0 < int(wei) <= MAX_U256:
                raise VoucherError(f"cumulative_wei must be a decimal string in (0, 2**256), got {wei!r:.80}")
            voucher = Voucher(
                check_address(data["operator"], "operator", VoucherError),
                check_address(data["drafter"], "drafter", VoucherError),
                check_uint(data["lane"], MAX_U64, "lane", VoucherError),
                int(wei),
                check_uint(data["issued_at"], MAX_U64, "issued_at", VoucherError),
            )
            chain_id = check_uint(data["chain_id"], MAX_U64, "chain_id", VoucherError)
            domain = escrow_domain(chain_id, check_address(data["escrow"], "escrow", VoucherError))
            return cls(domain, voucher, bytes.fromhex(sig[2:]))
        except (KeyError, AttributeError, TypeError, ValueError) as exc:  # VoucherError passes through
            raise VoucherError(f"malformed voucher: {exc!r}") from exc


def sign_voucher(private_key: bytes | str, domain: Domain, voucher: Voucher) -> SignedVoucher:
    """Sign ``voucher`` (eth-account signs deterministically, RFC 6979, with low s)."""
    signable = typed_signable(domain, VOUCHER_TYPES, voucher.message())
    return SignedVoucher(domain, voucher, bytes(account_module().sign_message(signable, private_key).signature))
