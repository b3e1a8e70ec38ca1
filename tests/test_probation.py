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
from node.target.engine import CompletionRequest, Engine, TimedModel
from node.target.market import MarketDrafting
from p2p.messages import DRAFT_PROTOCOL_ID, MAX_FRAME_BYTES, TO_DRAFTER, Advance, Draft, decode, encode
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


# -- the stream is held until the round's probation answers are in (issue 40 §6) --------------------

STREAMED = CompletionRequest("def parse(self, text):\n", max_tokens=6, temperature=0.0, seed=3, ignore_eos=True)
STREAM_DEADLINE_S = 1.0
HONEST_AFTER_S = 0.25  # after the tiny target's pass (a few ms), well inside the deadline
COPY_WAIT_S = 3.0  # the colluder gives up on a token never streamed after this long


async def streamed_job(target, drafter, ledger, pair, copy: bool):
    """One streamed job on a real Engine whose drafting is the market, with one drafter: new, so on
    probation. It answers every advance at k with one token: ``copy``, the token at k as soon as the
    client was streamed it (it colludes with the client, or is it); else, HONEST_AFTER_S after the
    ask, the true token (it knows the answer: the plain decoding's, as a good draft model would).
    Returns the answer's tokens, the drafter's stats, and the seconds from each ask to its token's
    arrival at the client."""
    streamed: list[int] = []
    streamed_at: list[float] = []
    asked_at: dict[int, float] = {}
    truth = (await Engine(pair, model_name="plain", gamma=GAMMA).complete(STREAMED)).tokens

    async def on_chunk(tokens, _text) -> None:
        streamed.extend(tokens)
        streamed_at.extend([time.perf_counter()] * len(tokens))

    async def drafter_side(stream) -> None:
        reader = VarIntLengthMsgReadWriter(stream, max_msg_size=MAX_FRAME_BYTES)
        with contextlib.suppress(IOException, trio.TooSlowError):
            while True:
                msg = decode(await reader.read_msg(), vocab_size=pair.target.vocab_size, allowed=TO_DRAFTER)
                if not isinstance(msg, Advance):
                    continue  # the open: the prompt's round is decoded alone; a settle ends the job
                asked_at[msg.start] = time.perf_counter()
                if copy:
                    with trio.fail_after(COPY_WAIT_S):
                        while len(streamed) <= msg.start:
                            await trio.sleep(0.001)
                    token = streamed[msg.start]
                else:
                    await trio.sleep(HONEST_AFTER_S)
                    token = truth[msg.start]
                await reader.write_msg(encode(Draft(msg.job, msg.start, (token,), (), 1.0)))

    drafter.set_stream_handler(DRAFT_PROTOCOL_ID, drafter_side)
    registry, peer = Registry(), str(drafter.get_id())
    registry.upsert(peer, [])
    engine = Engine(pair, model_name="market", gamma=GAMMA, batch_rows=0)
    engine.drafting = MarketDrafting(
        target, registry, Policy(), ledger, deadline_s=STREAM_DEADLINE_S, max_drafters=1,
        vocab_size=pair.target.vocab_size, wait_budget=0.0,
    )  # fmt: skip
    result = await engine.complete(STREAMED, on_chunk)
    assert result.tokens == truth  # whatever the drafter does, the answer is the target's
    delays = [streamed_at[k] - asked_at[k] for k in sorted(asked_at) if k < len(streamed_at)]
    return result.tokens, registry.stats(peer), delays


def test_a_drafter_copying_the_clients_stream_never_leaves_probation_succeeds(portal, hosts, ledger, pair):
    """The attack: a drafter on probation is not waited for, so it may answer after the round's pass;
    it answers with the token the client (its accomplice) was streamed. The round's tokens now reach
    the client only once the round's probation answers are in, or its deadline passed: the copy
    always comes too late, and the drafter never leaves probation. Old: the token was streamed at
    the end of the pass, the copy arrived inside the deadline, matched, and ended probation."""
    _, stats, delays = portal.run(streamed_job, *hosts, ledger, pair, True)
    assert stats.matched == 0 and stats.timeouts >= 1, stats
    assert Policy().on_probation(stats)
    assert delays and min(delays) >= STREAM_DEADLINE_S * 0.9, delays  # held to the round's deadline


def test_an_honest_drafter_slower_than_the_pass_still_leaves_probation_succeeds(portal, hosts, ledger, pair):
    """The control, and the hold's price: an honest answer that comes after the pass, inside the
    deadline, is judged on its token and ends probation; the round's token reaches the client right
    after that answer, not at the deadline."""
    _, stats, delays = portal.run(streamed_job, *hosts, ledger, pair, False)
    assert stats.matched >= 1 and stats.timeouts == 0, stats
    assert not Policy().on_probation(stats)
    assert delays[0] >= HONEST_AFTER_S and delays[0] < STREAM_DEADLINE_S / 2, delays
