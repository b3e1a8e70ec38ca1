"""Chain watchers survive a reorganisation (anvil's ``evm_snapshot`` / ``evm_revert``).

A reorganisation replaces the newest blocks: an event a watcher saw may be gone, and another may
now stand at a height the watcher had already scanned. Both watchers re-read the last REORG_DEPTH
blocks at every look (node.chain.events):

- the referee judges the challenge the chain holds now under an id, not the one it saw before;
- an operator's standing sees a slash mined at a height it had already passed, and forgets one
  whose block was replaced (an honest operator would otherwise refuse to serve for good).
"""

from __future__ import annotations

import pytest
from chainutil import challenge_now, deployed_chain, new_operator, request, sign_raw
from eth_account import Account

from node.chain.deployment import DEV_REFEREES, BondConfig, dev_key
from node.chain.receipts import RequestSpec
from node.chain.referee import Referee
from node.chain.standing import StandingWatch
from node.model.loading import TINY_TARGET, model_hash
from verifier.params import SamplingParams

RESOLVE_TIMEOUT_S = 600
BLOCKS_PASSED = 3  # blocks the watchers scan past before the chain goes back (fewer than REORG_DEPTH)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """A chain of this module's own: the tests move it back."""
    with deployed_chain(tmp_path_factory.mktemp("reorg-chain"), BondConfig(resolve_timeout=RESOLVE_TIMEOUT_S)) as chain:
        yield chain


@pytest.fixture(scope="module")
def committed() -> bytes:
    return model_hash(TINY_TARGET)


def _snapshot(chain) -> str:
    return chain.client.w3.provider.make_request("evm_snapshot", [])["result"]


def _revert(chain, snapshot: str) -> None:
    assert chain.client.w3.provider.make_request("evm_revert", [snapshot])["result"] is True


def _mine(chain, blocks: int) -> None:
    for _ in range(blocks):
        chain.client.w3.provider.make_request("evm_mine", [])


def _greedy_challenge(chain, key: bytes, committed: bytes, pair, *, wrong: bool, seed: int) -> int:
    """A challenge of the target's greedy token at position 0: its least likely token (the
    operator is at fault) or its most likely one (it is not)."""
    prompt = [pair.tokenizer.eos_token_id, *pair.tokenizer.encode("def parse_args(argv):")]
    pair.target.reset()
    logits = pair.target.extend(prompt)[-1]
    token = int(logits.argmin() if wrong else logits.argmax())
    return challenge_now(chain, key, committed, RequestSpec.build(prompt, SamplingParams(0.0), seed, 1), (token,))


def test_the_referee_judges_the_challenge_the_chain_holds_now_succeeds(chain, pair, committed, tmp_path):
    _, key = new_operator(chain, tmp_path / "operator", committed)
    lone = Referee(chain.client, [dev_key(DEV_REFEREES[0])], pair.target, committed, tmp_path / "pool")
    snapshot = _snapshot(chain)
    seen = _greedy_challenge(chain, key, committed, pair, wrong=True, seed=1)
    _mine(chain, BLOCKS_PASSED)
    first = {o.challenge_id: o for o in lone.run_once()}  # one signature of two: it stays open
    assert first[seen].operator_at_fault is True
    _revert(chain, snapshot)  # the blocks that held it are replaced...
    now = _greedy_challenge(chain, key, committed, pair, wrong=False, seed=2)  # ...by one under the same id
    assert now == seen
    again = {o.challenge_id: o for o in lone.run_once()}
    assert again[now].operator_at_fault is False  # judged what the chain holds now


def test_an_operators_standing_follows_a_reorganisation_succeeds(chain, committed, tmp_path):
    operator, key = new_operator(chain, tmp_path / "operator", committed)
    watch = StandingWatch(chain.client, Account.from_key(key).address, committed, poll_s=0.2)
    before = _snapshot(chain)
    _mine(chain, BLOCKS_PASSED)
    assert watch.check().serving  # the watch has looked past these blocks
    _revert(chain, before)
    unslashed = _snapshot(chain)
    spec = request(seed=3)
    a, b = sign_raw(key, chain, spec, (1,), committed), sign_raw(key, chain, spec, (2,), committed)
    chain.client.slash_equivocation(dev_key(7), a, b)  # mined at a height the watch had passed
    slashed = watch.check()
    assert not slashed.serving and "slashed" in slashed.reason, slashed.reason
    _revert(chain, unslashed)  # the block that held the slash is replaced: the bond is whole again
    assert watch.check().serving, watch.current().reason
    operator.close()
