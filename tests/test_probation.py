"""Probation (market.policy): a drafter with no matched token in its trial window is asked, and its
drafts are measured against what the target emits, but never verified, and no round waits for them.

The attack it bounds: a drafter whose drafts never match (random, lying, adversarial) used to cost
the target a γ + 1 wide verification pass per round, and its answer's wait, until judged. On
probation it costs neither: the round's pass is a plain one, run while the draft is on its way.
Real libp2p hosts on loopback; the target side is the market's own job and round code.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import trio
from libp2p.io.exceptions import IOException
from libp2p.io.msgio import VarIntLengthMsgReadWriter

from market.ledger import Ledger
from market.policy import Policy, PolicyConfig
from market.registry import Registry
from node.target.engine import TimedModel
from node.target.market import MarketDrafting
from p2p.messages import DRAFT_PROTOCOL_ID, MAX_FRAME_BYTES, Draft, encode
from verifier.params import SamplingParams

V = 4096
GAMMA = 4
CONTEXT = [0, 17, 99]  # the prompt [0], then the emitted tokens 17, 99: the round is at k = 2
START = 2
EMITTED = 5  # the token the target emits at k = 2 in this test (its pass is not run here)
ANSWER_AFTER_S = 0.6  # the drafter's answer comes this long after the round asked...
DEADLINE_S = 3.0  # ... well inside the round's deadline
NEVER = None


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    with Ledger(tmp_path_factory.mktemp("probation") / "ledger.sqlite") as book:
        yield book


async def two_rounds(
    target,
    drafter,
    ledger: Ledger,
    policy: Policy,
    answer_after_s: float | None,
    deadline_s: float,
    passes: TimedModel | None = None,
    pass_after_s: float = 0.0,
):
    """The prompt's round, the round at k = 2 (timed), then the round at k = 3, which settles k = 2.
    The drafter answers the advance to k = 2, after ``answer_after_s`` (NEVER: it answers nothing),
    with a draft whose first token is the one emitted there, and the advance to k = 3 at once.
    ``passes``: the job's timed target, whose pass for k = 2 (after which its token is out, streamed)
    runs ``pass_after_s`` after the round returned; None: no pass is run."""

    async def drafter_side(stream) -> None:
        reader = VarIntLengthMsgReadWriter(stream, max_msg_size=MAX_FRAME_BYTES)
        with contextlib.suppress(IOException):
            await reader.read_msg()  # the open, for the prompt's round
            await reader.read_msg()  # the advance to k = 2
            if answer_after_s is NEVER:
                return await trio.sleep_forever()
            await trio.sleep(answer_after_s)
            await reader.write_msg(encode(Draft("job-1", START, (EMITTED, 6, 7), (), 1.0)))
            await reader.read_msg()  # the advance to k = 3: answered at once
            await reader.write_msg(encode(Draft("job-1", START + 1, (6,), (), 1.0)))
            await trio.sleep_forever()

    drafter.set_stream_handler(DRAFT_PROTOCOL_ID, drafter_side)
    registry, peer = Registry(), str(drafter.get_id())
    registry.upsert(peer, [])
    drafting = MarketDrafting(target, registry, policy, ledger, deadline_s=deadline_s, max_drafters=1, vocab_size=V)
    async with drafting.job("job-1", SamplingParams(), 1, GAMMA) as proposer:
        if passes is not None:
            proposer.watch_passes(passes)

        def propose(context: list[int], start: int):
            return proposer.propose(context, start=start, gamma=GAMMA, params=SamplingParams(), seed=1)

        await trio.to_thread.run_sync(propose, CONTEXT[:1], 0)  # the prompt's round: sent only
        started = time.perf_counter()
        proposal = await trio.to_thread.run_sync(propose, CONTEXT, START)
        round_s = time.perf_counter() - started
        if passes is not None:
            await trio.sleep(pass_after_s)
            await trio.to_thread.run_sync(passes.extend, CONTEXT)  # the round's pass: EMITTED is out after it
        await trio.to_thread.run_sync(propose, [*CONTEXT, EMITTED], START + 1)
        records = proposer.round_records()
    return proposal, round_s, registry.stats(peer), records


def test_a_drafter_on_probation_is_measured_not_verified_nor_waited_for_succeeds(portal, hosts, ledger):
    proposal, round_s, stats, records = portal.run(two_rounds, *hosts, ledger, Policy(), ANSWER_AFTER_S, DEADLINE_S)
    assert proposal.tokens == () and round_s < ANSWER_AFTER_S / 2, (proposal, round_s)  # not verified, not waited
    # measured once the round settled (the next round waited out the rest of its answer's way)
    assert (stats.proposed, stats.matched, stats.timeouts, stats.errors) == (3, 1, 0, 0), stats
    assert not Policy().on_probation(stats)  # its first matched token ends the probation
    assert records[0]["kind"] == "probation" and records[0]["drafted"] == 0, records
    assert records[0]["wait_ms"] >= 1000 * ANSWER_AFTER_S / 2, records  # the settle's wait is the round's


def test_without_probation_the_round_waits_for_the_new_drafter_and_verifies_it_succeeds(portal, hosts, ledger):
    """The guard's control: the same drafter with probation off is waited for and verified."""
    policy = Policy(PolicyConfig(probation=False))
    proposal, round_s, stats, _ = portal.run(two_rounds, *hosts, ledger, policy, ANSWER_AFTER_S, DEADLINE_S)
    assert proposal.tokens == (EMITTED, 6, 7) and round_s >= ANSWER_AFTER_S, (proposal, round_s)
    assert (stats.proposed, stats.matched) == (3, 1), stats


def test_a_silent_drafter_on_probation_misses_the_round_at_its_deadline_succeeds(portal, hosts, ledger):
    deadline_s = 0.5
    proposal, round_s, stats, _ = portal.run(two_rounds, *hosts, ledger, Policy(), NEVER, deadline_s)
    assert proposal.tokens == () and round_s < deadline_s / 2, (proposal, round_s)
    assert (stats.proposed, stats.timeouts) == (0, 1), stats  # judged at the deadline, as any drafter
    assert Policy().on_probation(stats)
