"""Is the contract at an address the DrafterEscrow built from this repository?

A drafter takes vouchers only at an escrow that will pay them. Any contract can mimic DrafterEscrow's
ABI (report a large lane, emit ``Redeemed`` without paying), so the drafter compares the runtime code
at the address with the runtime code forge built from ``contracts/src`` (the artifact in
``contracts/out``, recorded when the contracts are built). Immutables (the thawing period, the
EIP-712 domain cache) are written into the runtime code at deployment, so the bytes the artifact
lists as immutable (``deployedBytecode.immutableReferences``) are zeroed on both sides before
hashing; everything else, the metadata hash of the sources included, must match byte for byte.
"""

from __future__ import annotations

import functools
import json

from eth_utils import keccak, to_checksum_address
from web3 import Web3

from node.chain import ChainError
from node.chain.deployment import ESCROW, artifact_path, load_artifact

Spans = tuple[tuple[int, int], ...]  # (start, length) of each immutable in the runtime code


class NotOurEscrow(ChainError):
    """The code at the address is not the DrafterEscrow of this repository."""


def masked_hash(code: bytes, immutables: Spans) -> bytes:
    """keccak256 of ``code`` with each immutable span zeroed."""
    masked = bytearray(code)
    for start, length in immutables:
        masked[start : start + length] = bytes(length)
    return keccak(bytes(masked))


@functools.cache
def built_escrow() -> tuple[bytes, Spans, int]:
    """The built DrafterEscrow's masked runtime hash, its immutable spans and its code length (forge
    builds it first when the artifact is missing or older than the sources)."""
    load_artifact(ESCROW)
    deployed = json.loads(artifact_path(ESCROW).read_text())["deployedBytecode"]
    code = bytes.fromhex(deployed["object"].removeprefix("0x"))
    spans = tuple(
        sorted(
            (int(ref["start"]), int(ref["length"])) for refs in deployed["immutableReferences"].values() for ref in refs
        )
    )
    return masked_hash(code, spans), spans, len(code)


def check_escrow_code(w3: Web3, address: str) -> None:
    """NotOurEscrow unless the runtime code at ``address`` is this repository's DrafterEscrow."""
    expected, spans, length = built_escrow()
    code = bytes(w3.eth.get_code(to_checksum_address(address)))
    if not code:
        raise NotOurEscrow(f"no contract at {address}")
    if len(code) != length or masked_hash(code, spans) != expected:
        raise NotOurEscrow(
            f"the contract at {address} is not the DrafterEscrow built from this repository "
            f"(runtime code hash 0x{masked_hash(code, spans).hex()[:16]}..., expected 0x{expected.hex()[:16]}...)"
        )
