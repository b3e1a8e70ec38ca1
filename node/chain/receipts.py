"""EIP-712 receipts and verdicts, byte-compatible with contracts/src/SpecmarketBond.sol.

Hashing (the contract's NatSpec and contracts/README.md state the same):
- a token list hashes to keccak256 over each token as one 32-byte big-endian word, no length prefix
  (Solidity's ``abi.encodePacked(uint32[])``);
- ``requestHash = keccak256(abi.encode(REQUEST_TYPEHASH, promptHash, seed, temperatureMicros, topK,
  topPMicros, maxTokens, stopHash))``, where ``stopHash`` (``stop_hash``, the contract's
  ``hashStopRule``) hashes the request's stop tokens the same way (ascending, no duplicates), and,
  when it has stop sequences, ``keccak256(abi.encode(that, keccak256(keccak256(s) for each s)))``:
  the answer ends at the first stop token, at the first token whose text completes a stop
  sequence, or at ``maxTokens``; no stop tokens nor sequences (``keccak256("")``) means it always
  runs to ``maxTokens`` (vLLM's ``ignore_eos``);
- receipts and verdicts are EIP-712 typed data (EIP-712, "Typed structured data hashing and
  signing") in the domain ("SpecmarketBond", "1", chainId, contract).

Fractional sampling parameters travel in millionths (``MICROS``). An operator decodes with the
quantized parameters (``RequestSpec.params``), so the receipt names exactly what was run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eth_abi import encode as abi_encode
from eth_keys.exceptions import BadSignature
from eth_utils import keccak, to_checksum_address

from node.chain import ChainError
from verifier.errors import InvalidParams, SpecmarketError
from verifier.noise import MAX_SEED
from verifier.params import SamplingParams

EIP712_NAME = "SpecmarketBond"
EIP712_VERSION = "1"
MICROS = 1_000_000
MAX_U32 = (1 << 32) - 1
MAX_U64 = (1 << 64) - 1
RECEIPT_FRESH_S = 300  # a client accepts a receipt at most this old; an operator re-signs older replays
CLOCK_SLACK_S = 60  # a receipt stamped up to this far in the chain's future (a fast operator clock) is accepted
MAX_RECEIPT_TOKENS = 1 << 16  # a receipt file or network message with more tokens is refused
RECEIPT_FORMAT = 4  # 2: receipts name their store nonce; 3: requests commit to their stop tokens; 4: and sequences
READ_FORMATS = (3, 4)  # a format-3 receipt (no stop sequences) still reads, as one with none
MAX_STOP_TOKENS = 16  # a request names at most this many end-of-sequence tokens (the contract's MAX_STOP_TOKENS)
MAX_STOP_SEQUENCES = 4  # OpenAI's `stop`: at most 4 strings (the contract's MAX_STOP_SEQUENCES)
MAX_STOP_SEQUENCE_BYTES = 64  # UTF-8 bytes in one (the contract's MAX_STOP_SEQUENCE_BYTES)
SIGNATURE_BYTES = 65
SECP256K1_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141  # the curve's group order
REQUEST_TYPEHASH = keccak(
    b"Request(bytes32 promptHash,uint64 seed,uint32 temperatureMicros,uint32 topK,uint32 topPMicros,uint32 maxTokens,"
    b"bytes32 stopHash)"
)
RECEIPT_TYPES = {
    "Receipt": [
        {"name": "operator", "type": "address"},
        {"name": "modelHash", "type": "bytes32"},
        {"name": "requestHash", "type": "bytes32"},
        {"name": "outputHash", "type": "bytes32"},
        {"name": "tokenCount", "type": "uint32"},
        {"name": "issuedAt", "type": "uint64"},
        {"name": "storeNonce", "type": "uint64"},
    ]
}
VERDICT_TYPES = {
    "Verdict": [
        {"name": "challengeId", "type": "uint256"},
        {"name": "receiptDigest", "type": "bytes32"},
        {"name": "position", "type": "uint32"},
        {"name": "challenger", "type": "address"},
        {"name": "operatorAtFault", "type": "bool"},
    ]
}


class ReceiptError(ChainError):
    """A receipt whose fields, hashes or signature do not hold together."""


def hash_tokens(tokens: Sequence[int]) -> bytes:
    """keccak256(abi.encodePacked(uint32[] tokens)): one 32-byte word per token."""
    return keccak(b"".join(int(t).to_bytes(32, "big") for t in tokens))


def _micros(value: float, name: str) -> int:
    micros = round(float(value) * MICROS)
    if not 0 <= micros <= MAX_U32:
        raise InvalidParams(f"{name} {value} does not fit a receipt (millionths in [0, 2**32))")
    return micros


def quantize(params: SamplingParams) -> SamplingParams:
    """The parameters a receipt can name exactly: temperature and top-p rounded to millionths."""
    t, p = _micros(params.temperature, "temperature"), _micros(params.top_p, "top_p")
    return SamplingParams(t / MICROS, params.top_k, p / MICROS)


def _check_tokens(tokens: Any, name: str) -> tuple[int, ...]:
    if not isinstance(tokens, (list, tuple)) or len(tokens) > MAX_RECEIPT_TOKENS:
        raise ReceiptError(f"{name} must be a list of at most {MAX_RECEIPT_TOKENS} token ids")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_U32 for t in tokens):
        raise ReceiptError(f"{name} must hold integers in [0, 2**32)")
    return tuple(tokens)


def check_uint(value: Any, bound: int, name: str, error: type[ReceiptError] = ReceiptError) -> int:
    """``value`` if it is an integer in [0, bound]; ``error`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= bound:
        raise error(f"{name} must be an integer in [0, {bound}], got {value!r:.80}")
    return value


def stop_hash(stop_tokens: Sequence[int], stop_sequences: Sequence[str]) -> bytes:
    """SpecmarketBond.hashStopRule: the packed tokens' hash alone when there are no sequences (as
    before stop sequences existed), else keccak256(abi.encode(it, keccak256(keccak256(s) ...)))."""
    tokens_hash = hash_tokens(stop_tokens)
    if not stop_sequences:
        return tokens_hash
    each = keccak(b"".join(keccak(s.encode()) for s in stop_sequences))
    return keccak(abi_encode(["bytes32", "bytes32"], [tokens_hash, each]))


def check_stop_sequences(sequences: Any, error: type[SpecmarketError]) -> tuple[str, ...]:
    """OpenAI's ``stop`` as a request commits to it: at most MAX_STOP_SEQUENCES non-empty strings of
    at most MAX_STOP_SEQUENCE_BYTES UTF-8 bytes each."""
    if not isinstance(sequences, (list, tuple)) or len(sequences) > MAX_STOP_SEQUENCES:
        raise error(f"stop must be a string or a list of at most {MAX_STOP_SEQUENCES} strings")
    for s in sequences:
        if not isinstance(s, str) or not s or len(s.encode("utf-8", "surrogatepass")) > MAX_STOP_SEQUENCE_BYTES:
            raise error(f"each stop sequence must be a non-empty string of at most {MAX_STOP_SEQUENCE_BYTES} bytes")
        if any(0xD800 <= ord(c) <= 0xDFFF for c in s):
            raise error("a stop sequence must be valid text (no lone surrogates)")
    return tuple(sequences)


def _contains(text: Callable[[Sequence[int]], str] | None, tokens: Sequence[int], sequences: Sequence[str]) -> bool:
    """Does the text of ``tokens`` contain a stop sequence?"""
    if text is None:
        raise ReceiptError("this request has stop sequences: judging where it ends needs the tokenizer's text")
    now = text(tokens)
    return any(s in now for s in sequences)


@dataclass(frozen=True)
class RequestSpec:
    """What a receipt's request hash commits to: prompt tokens, seed, sampling params, max tokens,
    and the stop rule: the answer ends at the first of ``stop_tokens`` (the model's end-of-sequence
    tokens; empty: it runs to ``max_tokens``), so the rule that ended an answer is auditable."""

    prompt: tuple[int, ...]
    seed: int
    temperature_micros: int
    top_k: int
    top_p_micros: int
    max_tokens: int
    stop_tokens: tuple[int, ...] = ()  # ascending, no duplicates
    stop_sequences: tuple[str, ...] = ()  # OpenAI's `stop`: the answer ends at the token whose text completes one

    def __post_init__(self) -> None:
        _check_tokens(self.prompt, "prompt")
        check_uint(self.seed, MAX_SEED, "seed")
        for name in ("temperature_micros", "top_k", "top_p_micros", "max_tokens"):
            check_uint(getattr(self, name), MAX_U32, name)
        stops = _check_tokens(self.stop_tokens, "stop_tokens")
        if len(stops) > MAX_STOP_TOKENS or list(stops) != sorted(set(stops)):
            raise ReceiptError(f"stop_tokens must be at most {MAX_STOP_TOKENS} ascending distinct token ids")
        check_stop_sequences(self.stop_sequences, ReceiptError)

    @classmethod
    def build(
        cls,
        prompt: Sequence[int],
        params: SamplingParams,
        seed: int,
        max_tokens: int,
        stop_tokens: Sequence[int] = (),
        stop_sequences: Sequence[str] = (),
    ) -> RequestSpec:
        t, p = _micros(params.temperature, "temperature"), _micros(params.top_p, "top_p")
        stops = tuple(sorted({int(x) for x in stop_tokens}))
        prompt_ids = tuple(int(x) for x in prompt)
        return cls(prompt_ids, int(seed), t, int(params.top_k), p, int(max_tokens), stops, tuple(stop_sequences))

    def end_of(
        self, output: Sequence[int], text: Callable[[Sequence[int]], str] | None = None, start: int = 0
    ) -> int | None:
        """The length at which this request's rule ends an answer that begins with ``output``: just
        past its first stop token, or past the first token whose text (``text`` of the tokens so
        far: needed when the request has stop sequences) contains a stop sequence; None: the rule
        does not end it within ``output`` (it runs on, to ``max_tokens``). ``start``: the rule is
        known not to end it before that length (a decode loop checks only its new tokens)."""
        stops = set(self.stop_tokens)
        for i in range(start, len(output)):
            if output[i] in stops or (self.stop_sequences and _contains(text, output[: i + 1], self.stop_sequences)):
                return i + 1
        return None

    def ended_by_rule(self, output: Sequence[int], text: Callable[[Sequence[int]], str] | None = None) -> bool:
        """Whether ``output`` ends where this request's rule ends it: at its first stop token or the
        token that completes its first stop sequence, or at ``max_tokens`` with no end before. An
        answer cut short, or run past its end, breaks the rule whatever its tokens are."""
        end = self.end_of(output, text)
        return end == len(output) if end is not None else len(output) == self.max_tokens

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature_micros / MICROS, self.top_k, self.top_p_micros / MICROS)

    def params_tuple(self) -> tuple[int, int, int, int, int, bytes]:
        """The contract's ``SamplingParams`` struct."""
        return (
            self.seed,
            self.temperature_micros,
            self.top_k,
            self.top_p_micros,
            self.max_tokens,
            self.stop_hash(),
        )

    def stop_hash(self) -> bytes:
        """The contract's ``hashStopRule`` of this request's stop tokens and sequences."""
        return stop_hash(self.stop_tokens, self.stop_sequences)

    def hash(self) -> bytes:
        words = (REQUEST_TYPEHASH, hash_tokens(self.prompt), *self.params_tuple())
        types = ["bytes32", "bytes32", "uint64", "uint32", "uint32", "uint32", "uint32", "bytes32"]
        return keccak(abi_encode(types, words))


@dataclass(frozen=True)
class Domain:
    """The EIP-712 domain: one deployment of a contract (SpecmarketBond unless named) on one chain."""

    chain_id: int
    contract: str
    name: str = EIP712_NAME
    version: str = EIP712_VERSION

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "chainId": self.chain_id,
            "verifyingContract": to_checksum_address(self.contract),
        }


@dataclass(frozen=True)
class Receipt:
    """The signed statement: ``operator`` answered ``request_hash`` with ``output_hash``."""

    operator: str
    model_hash: bytes
    request_hash: bytes
    output_hash: bytes
    token_count: int
    issued_at: int
    # the signing receipt store's random nonce: two receipts are equivocation only when one store
    # signed both (a lost store or a replica of the key signs under another nonce)
    store_nonce: int

    def as_tuple(self) -> tuple:
        """The contract's ``Receipt`` struct."""
        return (
            to_checksum_address(self.operator),
            self.model_hash,
            self.request_hash,
            self.output_hash,
            self.token_count,
            self.issued_at,
            self.store_nonce,
        )

    def message(self) -> dict[str, Any]:
        names = [field["name"] for field in RECEIPT_TYPES["Receipt"]]
        return dict(zip(names, self.as_tuple(), strict=True))


def account_module():
    """eth-account's ``Account``, imported on first use: it loads in about a second (py_ecc), and
    a target that is not bonded, or a client that checks no receipt, never needs it."""
    from eth_account import Account

    return Account


def typed_signable(domain: Domain, types: dict, message: dict[str, Any]):
    """EIP-712 typed data, ready to sign or recover (eth-account's SignableMessage)."""
    from eth_account.messages import encode_typed_data

    return encode_typed_data(domain_data=domain.as_dict(), message_types=types, message_data=message)


def receipt_signable(domain: Domain, receipt: Receipt):
    return typed_signable(domain, RECEIPT_TYPES, receipt.message())


@dataclass(frozen=True)
class Disputed:
    """What a verdict is about: the challenge, and the receipt (by EIP-712 digest), position and
    challenger it names. A verdict signs all four, so it cannot land on another challenge that
    happens to get the same id (after a reorg, say)."""

    challenge_id: int
    receipt_digest: bytes
    position: int
    challenger: str

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Disputed:
        """From a decoded ``ChallengeOpened`` event."""
        return cls(int(event["id"]), bytes(event["receiptDigest"]), int(event["position"]), str(event["challenger"]))

    def tag(self) -> str:
        """A short name of the disputed claim (for file names)."""
        words = (self.challenge_id, self.receipt_digest, self.position, to_checksum_address(self.challenger))
        return keccak(abi_encode(["uint256", "bytes32", "uint32", "address"], words))[:8].hex()


def verdict_signable(domain: Domain, disputed: Disputed, operator_at_fault: bool):
    message = {
        "challengeId": disputed.challenge_id,
        "receiptDigest": disputed.receipt_digest,
        "position": disputed.position,
        "challenger": to_checksum_address(disputed.challenger),
        "operatorAtFault": operator_at_fault,
    }
    return typed_signable(domain, VERDICT_TYPES, message)


def sign_receipt(private_key: bytes | str, domain: Domain, receipt: Receipt) -> bytes:
    """65-byte r‖s‖v signature (eth-account signs with low s, as OpenZeppelin's ECDSA requires)."""
    return bytes(account_module().sign_message(receipt_signable(domain, receipt), private_key).signature)


def sign_verdict(private_key: bytes | str, domain: Domain, disputed: Disputed, operator_at_fault: bool) -> bytes:
    return bytes(
        account_module().sign_message(verdict_signable(domain, disputed, operator_at_fault), private_key).signature
    )


def check_canonical(signature: bytes) -> None:
    """Accept only what OpenZeppelin's ECDSA accepts: 65 bytes r‖s‖v, s in the lower half of the
    curve order (EIP-2), v 27 or 28. A high-s twin of a valid signature recovers to the same signer
    in eth-account but reverts on chain, so anything Python accepts here must pass on chain too."""
    if len(signature) != SIGNATURE_BYTES:
        raise ReceiptError(f"a signature is {SIGNATURE_BYTES} bytes, got {len(signature)}")
    s, v = int.from_bytes(signature[32:64], "big"), signature[64]
    if s > SECP256K1_N // 2:
        raise ReceiptError("the signature's s is in the upper half of the curve order (not canonical, EIP-2)")
    if v not in (27, 28):
        raise ReceiptError(f"the signature's v must be 27 or 28, got {v}")


def recover_signer(
    domain: Domain, types: dict, message: dict[str, Any], signature: bytes, error: type[ReceiptError] = ReceiptError
) -> str:
    """The address that signed the typed data (canonical low-s signatures only, as the contracts
    require); ``error`` for a signature that is not canonical or names no key."""
    try:
        check_canonical(signature)
        return account_module().recover_message(typed_signable(domain, types, message), signature=signature)
    except ReceiptError as exc:
        raise error(str(exc)) from None
    except (ValueError, TypeError, BadSignature) as exc:  # BadSignature: r, s name no point (e.g. zero)
        raise error(f"unrecoverable signature: {exc}") from exc


def recover_receipt_signer(domain: Domain, receipt: Receipt, signature: bytes) -> str:
    return recover_signer(domain, RECEIPT_TYPES, receipt.message(), signature)


def _hex32(value: Any, name: str) -> bytes:
    if not isinstance(value, str) or not value.startswith("0x") or len(value) != 66:
        raise ReceiptError(f"{name} must be a 0x-prefixed 32-byte hex string")
    try:
        return bytes.fromhex(value[2:])
    except ValueError as exc:
        raise ReceiptError(f"{name} is not hex: {exc}") from exc


def check_address(value: Any, name: str, error: type[ReceiptError] = ReceiptError) -> str:
    """``value`` as a checksummed address; ``error`` if it is none."""
    try:
        return to_checksum_address(value)
    except (ValueError, TypeError) as exc:
        raise error(f"{name} is not an address: {value!r:.80}") from exc


@dataclass(frozen=True)
class SignedReceipt:
    """What a client gets with an answer and a challenger submits: the receipt, its signature, the
    domain it was signed in, and the preimages of its request and output hashes."""

    domain: Domain
    receipt: Receipt
    signature: bytes
    request: RequestSpec
    output: tuple[int, ...]

    def check(self, recover: Callable[[Domain, Receipt, bytes], str] | None = None) -> None:
        """Raise ReceiptError unless the preimages match the hashes and the operator signed it.
        ``recover``: the signer recovery (default ``recover_receipt_signer``, through eth-account)."""
        recover = recover or recover_receipt_signer
        r = self.receipt
        if self.request.hash() != r.request_hash:
            raise ReceiptError("the request does not hash to the receipt's request hash")
        if hash_tokens(self.output) != r.output_hash or len(self.output) != r.token_count:
            raise ReceiptError("the output does not hash to the receipt's output hash and token count")
        signer = recover(self.domain, r, self.signature)
        if signer != to_checksum_address(r.operator):
            raise ReceiptError(f"the receipt is signed by {signer}, not by its operator {r.operator}")

    def to_json(self) -> dict[str, Any]:
        r = self.receipt
        return {
            "format": RECEIPT_FORMAT,
            "chain_id": self.domain.chain_id,
            "contract": to_checksum_address(self.domain.contract),
            "receipt": {
                "operator": to_checksum_address(r.operator),
                "model_hash": "0x" + r.model_hash.hex(),
                "request_hash": "0x" + r.request_hash.hex(),
                "output_hash": "0x" + r.output_hash.hex(),
                "token_count": r.token_count,
                "issued_at": r.issued_at,
                "store_nonce": r.store_nonce,
            },
            "signature": "0x" + self.signature.hex(),
            "request": {
                **asdict(self.request),
                "prompt": list(self.request.prompt),
                "stop_tokens": list(self.request.stop_tokens),
                "stop_sequences": list(self.request.stop_sequences),
            },
            "output": list(self.output),
        }

    @classmethod
    def from_json(cls, data: Any) -> SignedReceipt:
        """Parse untrusted JSON (a file, an HTTP answer); every field is type- and range-checked."""
        try:
            if data.get("format") not in READ_FORMATS:
                raise ReceiptError(f"unknown receipt format {data.get('format')!r} (expected {RECEIPT_FORMAT})")
            r, q = data["receipt"], data["request"]
            sig = data["signature"]
            if not isinstance(sig, str) or not sig.startswith("0x") or len(sig) != 2 + 2 * SIGNATURE_BYTES:
                raise ReceiptError(f"signature must be 0x + {SIGNATURE_BYTES} bytes of hex")
            receipt = Receipt(
                operator=check_address(r["operator"], "receipt.operator"),
                model_hash=_hex32(r["model_hash"], "receipt.model_hash"),
                request_hash=_hex32(r["request_hash"], "receipt.request_hash"),
                output_hash=_hex32(r["output_hash"], "receipt.output_hash"),
                token_count=check_uint(r["token_count"], MAX_U32, "receipt.token_count"),
                issued_at=check_uint(r["issued_at"], MAX_U64, "receipt.issued_at"),
                store_nonce=check_uint(r["store_nonce"], MAX_U64, "receipt.store_nonce"),
            )
            fields = ("seed", "temperature_micros", "top_k", "top_p_micros", "max_tokens")
            prompt, stops = _check_tokens(q["prompt"], "request.prompt"), _check_tokens(q["stop_tokens"], "stop_tokens")
            sequences = check_stop_sequences(q.get("stop_sequences", []), ReceiptError)
            request = RequestSpec(prompt, *(q[f] for f in fields), stops, sequences)
            domain = Domain(
                check_uint(data["chain_id"], MAX_U64, "chain_id"), check_address(data["contract"], "contract")
            )
            return cls(domain, receipt, bytes.fromhex(sig[2:]), request, _check_tokens(data["output"], "output"))
        except (KeyError, AttributeError, TypeError, ValueError) as exc:  # ReceiptError passes through
            raise ReceiptError(f"malformed receipt: {exc!r}") from exc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)
