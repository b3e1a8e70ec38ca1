"""A drafter's cover checks (node.drafter.cover_watch) on a real anvil: every check concludes even when
its job is over first, a lane still short is a verdict on the operator, the drafter's own chain
endpoint failing is not, and a second job of an operator whose check is in flight waits for its own.

Each failing check takes COVER_WAIT_S (5 s): the lane may be funded meanwhile."""

from __future__ import annotations

import pytest
import trio
from chainutil import deployed_chain
from eth_account import Account

from node.chain.anvil import free_port
from node.chain.deployment import DEV_DEPLOYER, ETHER, dev_key
from node.chain.escrow import EscrowClient
from node.drafter.cover import CoverChecks
from node.drafter.cover_watch import CoverWatch
from node.drafter.terms import Terms
from node.drafter.wallet import Wallet

PRICE_WEI = 10**9
MAX_PAY_WEI = PRICE_WEI * 64
OPERATOR_KEY = dev_key(DEV_DEPLOYER)  # anvil's public dev key: tests only
OPERATOR = Account.from_key(OPERATOR_KEY).address


@pytest.fixture(scope="module")
def escrow_chain(tmp_path_factory):
    with deployed_chain(tmp_path_factory.mktemp("cover-watch"), escrow=True) as chain:
        yield chain, EscrowClient(chain.client.w3, chain.deployment.escrow)


def terms(escrow: EscrowClient, lane: int) -> Terms:
    return Terms(escrow.domain.chain_id, escrow.address, OPERATOR, lane, PRICE_WEI, MAX_PAY_WEI)


def opened(escrow: EscrowClient, tmp_path, lane: int) -> tuple[Wallet, str, Terms]:
    """A fresh drafter's wallet, its payout address, and the terms of a job on ``lane``, opened."""
    payout = Account.create().address
    wallet = Wallet.open(tmp_path, payout)
    t = terms(escrow, lane)
    wallet.opened(t)
    return wallet, payout, t


def run_jobs(watch: CoverWatch, jobs: list[Terms], payout: str, job_s: float = 0.1) -> list[tuple[str, bool]]:
    """Each job's check started as a session would, the jobs one after another, each over after
    ``job_s`` (its session nursery cancelled: the check runs on in the drafter's nursery); then every
    check's outcome (why, whether it had to pass before the job drafted)."""
    outcomes: list = []

    async def main() -> None:
        async with trio.open_nursery() as drafter:
            for t in jobs:
                with trio.move_on_after(job_s):  # the job's session, over before its check
                    check, wait_first = watch.start(drafter, t, payout)
                    outcomes.append((check, wait_first))
                    await trio.sleep_forever()
        # the drafter's nursery waited for every check

    trio.run(main)
    return [(check.why, wait_first) for check, wait_first in outcomes]


def test_a_check_concludes_after_its_job_and_a_short_lane_is_a_verdict_succeeds(escrow_chain, tmp_path):
    """The attack: short jobs on a lane that is never funded. Each job ends before its check; the
    check still concludes, and its failure refuses the operator. The second job, opened while the
    first's check was in flight, drafts only once its own passes."""
    chain, escrow = escrow_chain
    wallet, payout, t = opened(escrow, tmp_path, lane=1)
    outcomes = run_jobs(CoverWatch(CoverChecks(chain.rpc), wallet), [t, t], payout)
    assert [wait_first for _, wait_first in outcomes] == [False, True]
    assert all("short of" in why for why, _ in outcomes), outcomes
    assert (wallet.refusal(t.account) or "").startswith("unpaid: lane 1 of operator"), wallet.refusal(t.account)


def test_a_covered_lane_passes_and_clears_a_lapsed_verdict_succeeds(escrow_chain, tmp_path):
    chain, escrow = escrow_chain
    wallet, payout, t = opened(escrow, tmp_path, lane=2)
    wallet.mark_cover(t.account, "lane 2 was short an hour ago")
    escrow.fund_lane(OPERATOR_KEY, payout, 2, 0, value=ETHER // 100)
    assert run_jobs(CoverWatch(CoverChecks(chain.rpc), wallet), [t], payout) == [("", False)]
    assert wallet.refusal(t.account) is None


def test_the_drafters_own_chain_endpoint_failing_is_no_verdict_on_the_operator_succeeds(escrow_chain, tmp_path):
    _, escrow = escrow_chain
    wallet, payout, t = opened(escrow, tmp_path, lane=3)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ((why, _),) = run_jobs(CoverWatch(CoverChecks(dead), wallet), [t], payout)
    assert why.startswith("cannot read the lane"), why  # that job is refused...
    assert wallet.refusal(t.account) is None  # ... and the operator is not
