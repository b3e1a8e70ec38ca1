"""An operator's bond over time, on its own anvil (the clock is moved): unbonding waits out the delay
and any open challenge; a challenge the referees leave unresolved is refunded after the timeout."""

from __future__ import annotations

import subprocess
import sys

import pytest
from chainutil import deployed_chain, new_operator, request, warp

from node.chain.deployment import DEV_CHALLENGER, dev_address, dev_key

TIMEOUT_S = 180


@pytest.fixture(scope="module")
def own_chain(tmp_path_factory):
    with deployed_chain(tmp_path_factory.mktemp("lifecycle")) as chain:
        yield chain


def cli(chain, *argv: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "node", "chain", argv[0], *chain.cli_args(), *argv[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_unbond_waits_for_open_challenges_and_the_delay_and_expired_challenges_are_refunded(own_chain, tmp_path):
    chain = own_chain
    cfg = chain.client.config()
    operator, key = new_operator(chain, tmp_path)
    key_file = tmp_path / "operator.key"
    key_file.write_text(key.hex())
    signed = operator.sign(request(seed=8), (1, 2, 3))
    cid, _ = chain.client.challenge(dev_key(DEV_CHALLENGER), signed, 1)  # no referee will answer

    unbond = cli(chain, "unbond", "--key-file", str(key_file))
    assert unbond.returncode == 0, unbond.stderr
    assert not chain.client.operator_info(operator.address).active
    early = cli(chain, "withdraw-bond", "--key-file", str(key_file))
    assert early.returncode == 2 and "UnbondingDelayNotElapsed" in early.stderr

    not_yet = cli(chain, "refund", str(cid))
    assert not_yet.returncode == 2 and "ResolveWindowNotClosed" in not_yet.stderr
    warp(chain, cfg.unbonding_delay + 1)
    blocked = cli(chain, "withdraw-bond", "--key-file", str(key_file))
    assert blocked.returncode == 2 and "HasOpenChallenges" in blocked.stderr  # the challenge is still open

    credits = chain.client.credits(dev_address(DEV_CHALLENGER))
    refund = cli(chain, "refund", str(cid))
    assert refund.returncode == 0, refund.stderr
    assert chain.client.credits(dev_address(DEV_CHALLENGER)) - credits == cfg.challenger_bond
    balance = chain.client.w3.eth.get_balance(operator.address)
    withdrawn = cli(chain, "withdraw-bond", "--key-file", str(key_file))
    assert withdrawn.returncode == 0, withdrawn.stderr
    assert chain.client.operator_info(operator.address).bond == 0
    gained = chain.client.w3.eth.get_balance(operator.address) - balance
    assert cfg.min_bond - 10**16 < gained <= cfg.min_bond  # the bond, less gas
