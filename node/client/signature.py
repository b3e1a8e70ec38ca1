"""A receipt's signature checked without eth-account, whose import costs a third of a second of
every `specmarket ask` (it loads py_ecc's BLS pairing tables through eth-keyfile, none of which a
signature check uses).

``check_signed`` is ``SignedReceipt.check`` (node/chain/receipts.py): the request and output
preimages match their hashes, and the signature is canonical (``check_canonical``, as
OpenZeppelin's ECDSA) and recovers to the receipt's operator. The EIP-712 digest is built here from
the receipt's own type table (``RECEIPT_TYPES``) and domain with keccak and ABI encoding, and the
signer recovered with eth-keys (both already loaded by node.chain.receipts). The tests hold it to
eth-account's digest and signer and to the contract's ``receiptDigest`` on a real chain.
"""

from __future__ import annotations

from eth_abi import encode as abi_encode
from eth_keys import keys
from eth_keys.exceptions import BadSignature
from eth_utils import keccak, to_checksum_address

from node.chain.receipts import (
    RECEIPT_TYPES,
    Domain,
    Receipt,
    ReceiptError,
    SignedReceipt,
    check_canonical,
)

DOMAIN_TYPE = b"EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"


def _type_string(name: str, fields: list[dict[str, str]]) -> bytes:
    """EIP-712's ``encodeType`` of a struct of atomic fields: ``Name(type name,...)``."""
    members = ",".join(f"{field['type']} {field['name']}" for field in fields)
    return f"{name}({members})".encode()


def domain_separator(domain: Domain) -> bytes:
    values = [keccak(DOMAIN_TYPE), keccak(text=domain.name), keccak(text=domain.version), domain.chain_id]
    types = ["bytes32", "bytes32", "bytes32", "uint256", "address"]
    return keccak(abi_encode(types, [*values, to_checksum_address(domain.contract)]))


def receipt_digest(domain: Domain, receipt: Receipt) -> bytes:
    """The EIP-712 digest an operator signs for ``receipt`` (the contract's ``receiptDigest``)."""
    fields = RECEIPT_TYPES["Receipt"]
    typehash = keccak(_type_string("Receipt", fields))
    message = receipt.message()
    struct = abi_encode(["bytes32", *(f["type"] for f in fields)], [typehash, *(message[f["name"]] for f in fields)])
    return keccak(b"\x19\x01" + domain_separator(domain) + keccak(struct))


def receipt_signer(domain: Domain, receipt: Receipt, signature: bytes) -> str:
    """The checksummed address that signed ``receipt`` (canonical low-s signatures only)."""
    check_canonical(signature)
    r, s, v = signature[:32], signature[32:64], signature[64]
    try:
        vrs = (v - 27, int.from_bytes(r, "big"), int.from_bytes(s, "big"))
        public = keys.Signature(vrs=vrs).recover_public_key_from_msg_hash(receipt_digest(domain, receipt))
    except (ValueError, BadSignature) as exc:  # r, s name no point on the curve (e.g. zero)
        raise ReceiptError(f"unrecoverable signature: {exc}") from exc
    return public.to_checksum_address()


def check_signed(signed: SignedReceipt) -> None:
    """``SignedReceipt.check`` with the signer recovered here, without eth-account."""
    signed.check(recover=receipt_signer)
