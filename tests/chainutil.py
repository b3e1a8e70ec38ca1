"""Helpers for tests against a real anvil chain with SpecmarketBond deployed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from eth_account import Account

from node.chain.anvil import AnvilProcess, free_port
from node.chain.client import BondClient, connect, deploy
from node.chain.deployment import (
    DEFAULT_THAWING_PERIOD_S,
    DEFAULT_THRESHOLD,
    DEV_CHALLENGER,
    DEV_DEPLOYER,
    DEV_REFEREES,
    BondConfig,
    Deployment,
    dev_address,
    dev_key,
)
from node.chain.escrow import deploy_escrow
from node.chain.operator import Operator
from node.chain.receipts import Receipt, RequestSpec, SignedReceipt, hash_tokens, sign_receipt
from node.chain.store import ReceiptStore
from verifier.params import SamplingParams


@dataclass(frozen=True)
class Chain:
    rpc: str
    deployments: Path
    deployment: Deployment
    client: BondClient
    deploy_gas: int

    def cli_args(self) -> list[str]:
        return ["--rpc", self.rpc, "--deployments", str(self.deployments)]


@contextmanager
def deployed_chain(deployments: Path, config: BondConfig | None = None, *, escrow: bool = False) -> Iterator[Chain]:
    """A fresh anvil on a free port with SpecmarketBond deployed (defaults as Deploy.s.sol) and, with
    ``escrow``, a DrafterEscrow beside it (recorded in the deployment: bonded targets then pay drafters)."""
    with AnvilProcess(free_port()) as anvil:
        w3 = connect(anvil.url)
        referees = [dev_address(i) for i in DEV_REFEREES]
        deployment, tx = deploy(w3, dev_key(DEV_DEPLOYER), config or BondConfig(), referees, DEFAULT_THRESHOLD)
        if escrow:
            address, _ = deploy_escrow(w3, dev_key(DEV_DEPLOYER), DEFAULT_THAWING_PERIOD_S)
            deployment = replace(deployment, escrow=address, thawing_period=DEFAULT_THAWING_PERIOD_S)
        deployment.save(deployments)
        yield Chain(anvil.url, deployments, deployment, BondClient(w3, deployment.address), tx.gas_used)


def warp(chain: Chain, seconds: int) -> None:
    """Move the chain's clock forward and mine a block (anvil only)."""
    chain.client.w3.provider.make_request("evm_increaseTime", [seconds])
    chain.client.w3.provider.make_request("evm_mine", [])


def new_operator(chain: Chain, tmp: Path, model_hash: bytes = b"\x42" * 32) -> tuple[Operator, bytes]:
    """A fresh operator key, funded from anvil account 0 and bonded with the minimum."""
    key = bytes(Account.create().key)
    operator = Operator(chain.client, key, model_hash, ReceiptStore(tmp / f"receipts-{key[:4].hex()}.sqlite"))
    operator.ensure_bonded()
    return operator, key


def sign_raw(
    key: bytes,
    chain: Chain,
    request: RequestSpec,
    output: tuple[int, ...],
    model_hash: bytes,
    domain=None,
    issued_at: int | None = None,
    store_nonce: int = 0,
) -> SignedReceipt:
    """A receipt signed directly with ``key`` (bypassing an operator's store): how a dishonest or
    careless operator would equivocate, or sign for another domain. ``store_nonce`` names the
    signing store (the same by default: receipts of one store)."""
    domain = domain or chain.client.domain
    operator = Account.from_key(key).address
    # the chain's clock, as an operator stamps receipts: anvil's clock can lag this machine's
    issued = chain_now(chain) if issued_at is None else issued_at
    receipt = Receipt(operator, model_hash, request.hash(), hash_tokens(output), len(output), issued, store_nonce)
    return SignedReceipt(domain, receipt, sign_receipt(key, domain, receipt), request, output)


def request(prompt=(5, 6, 7), seed: int = 1, max_tokens: int = 4, temperature: float = 1.0) -> RequestSpec:
    return RequestSpec.build(prompt, SamplingParams(temperature), seed, max_tokens)


def chain_now(chain: Chain) -> int:
    """The latest block's timestamp (anvil's clock, which tests move with ``warp``)."""
    return int(chain.client.w3.eth.get_block("latest")["timestamp"])


def challenge_now(chain: Chain, key: bytes, committed: bytes, spec: RequestSpec, output: tuple[int, ...]) -> int:
    """Sign ``output`` for ``spec`` with operator ``key`` at chain time and challenge position 0 (dev challenger)."""
    signed = sign_raw(key, chain, spec, output, committed, issued_at=chain_now(chain))
    cid, _ = chain.client.challenge(dev_key(DEV_CHALLENGER), signed, 0)
    return cid


WRONG_ANSWER_PROMPT = "def parse_args(argv):"


def wrong_answer_challenge(chain: Chain, key: bytes, committed: bytes, pair, seed: int) -> int:
    """A challenge on a clearly wrong greedy token: the target's least likely one."""
    prompt = [pair.tokenizer.eos_token_id, *pair.tokenizer.encode(WRONG_ANSWER_PROMPT)]
    pair.target.reset()
    wrong = int(pair.target.extend(prompt)[-1].argmin())
    return challenge_now(chain, key, committed, RequestSpec.build(prompt, SamplingParams(0.0), seed, 1), (wrong,))


def count_calls(client: BondClient) -> Counter[str]:
    """From now on, count the contract's view functions that ``client`` calls, by name (each call
    still goes to the chain)."""
    counts: Counter[str] = Counter()
    call = client.call

    def counted(fn: str, *args):
        counts[fn] += 1
        return call(fn, *args)

    client.call = counted
    return counts
