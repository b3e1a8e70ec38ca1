"""The owner cannot slash at will (issue: hardening), against a real anvil.

A referee-set change waits the contract's ``refereeSetDelay`` (longer than the unbonding delay),
and each challenge is decided by the referee epoch it opened in. So the owner that makes itself a
1-of-1 quorum decides nothing that was open before, and cannot slash an operator that left when
the proposal appeared. The referee process follows: it signs only for challenges of an epoch it
belongs to, and counts the quorum of that epoch.
"""

from __future__ import annotations

import pytest
from chainutil import chain_now, deployed_chain, new_operator, warp, wrong_answer_challenge

from node.chain.client import ChainRevert
from node.chain.deployment import DEV_DEPLOYER, DEV_REFEREES, BondConfig, dev_address, dev_key
from node.chain.referee import Referee
from node.model.loading import TINY_TARGET, model_hash

RESOLVE_TIMEOUT_S = 600
AT_FAULT = 2
OWNER = dev_address(DEV_DEPLOYER)


@pytest.fixture()
def chain(tmp_path):
    """A chain of this test's own: the tests move its clock by hours."""
    with deployed_chain(tmp_path / "deployments", BondConfig(resolve_timeout=RESOLVE_TIMEOUT_S)) as chain:
        yield chain


@pytest.fixture(scope="module")
def committed() -> bytes:
    return model_hash(TINY_TARGET)


def _referee(chain, pair, committed, pool, indices) -> Referee:
    return Referee(chain.client, [dev_key(i) for i in indices], pair.target, committed, pool)


def _outcome(referee: Referee, cid: int):
    (outcome,) = [o for o in referee.run_once() if o.challenge_id == cid]
    return outcome


def test_challenge_is_decided_by_the_epoch_it_opened_in_succeeds(chain, pair, committed, tmp_path):
    _, key = new_operator(chain, tmp_path, committed)
    delay = chain.client.call("refereeSetDelay")
    assert delay > chain.client.call("unbondingDelay")
    proposed = chain.client.propose_referee_set(dev_key(DEV_DEPLOYER), [OWNER], 1)  # the owner alone
    assert proposed["eta"] == chain_now(chain) + delay
    with pytest.raises(ChainRevert, match="RefereeSetNotReady"):
        chain.client.activate_referee_set(dev_key(DEV_DEPLOYER))
    warp(chain, delay - 120)
    old = wrong_answer_challenge(chain, key, committed, pair, seed=11)  # opened in epoch 1
    warp(chain, 120)
    assert chain.client.activate_referee_set(dev_key(DEV_DEPLOYER))["epoch"] == 2
    assert chain.client.referees() == [OWNER] and chain.client.challenge_record(old)["referee_epoch"] == 1

    owner = _referee(chain, pair, committed, tmp_path / "pool", [DEV_DEPLOYER])
    assert _outcome(owner, old).signatures == 0  # not a referee of epoch 1: it signs nothing
    assert chain.client.challenge_status(old) == 1
    first = _referee(chain, pair, committed, tmp_path / "pool", DEV_REFEREES[:1])
    assert not _outcome(first, old).resolved  # epoch 1's threshold is 2, not epoch 2's 1
    second = _referee(chain, pair, committed, tmp_path / "pool", DEV_REFEREES[1:2])
    assert _outcome(second, old).resolved and chain.client.challenge_record(old)["status"] == AT_FAULT

    new = wrong_answer_challenge(chain, key, committed, pair, seed=12)  # opened in epoch 2
    assert _outcome(first, new).signatures == 0  # epoch 1's referees have no say in it
    assert _outcome(owner, new).resolved  # the new set does decide challenges opened after it


def test_operator_leaves_before_a_proposed_set_can_judge_it_succeeds(chain, pair, committed, tmp_path):
    operator, key = new_operator(chain, tmp_path, committed)
    chain.client.propose_referee_set(dev_key(DEV_DEPLOYER), [OWNER], 1)
    chain.client.send(key, "requestUnbond")  # the operator sees the proposal and leaves
    warp(chain, chain.client.call("unbondingDelay"))
    chain.client.send(key, "withdrawBond")  # before the proposed set can be activated
    with pytest.raises(ChainRevert, match="RefereeSetNotReady"):
        chain.client.activate_referee_set(dev_key(DEV_DEPLOYER))
    warp(chain, chain.client.call("refereeSetDelay"))
    chain.client.activate_referee_set(dev_key(DEV_DEPLOYER))
    with pytest.raises(ChainRevert, match="NotRegistered"):  # nothing left to slash
        wrong_answer_challenge(chain, key, committed, pair, seed=13)
    assert not chain.client.operator_info(operator.address).registered
