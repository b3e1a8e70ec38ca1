"""The target's side of the draft protocol under hypothesis-generated hostile drafts.

A real libp2p host pair in one trio loop: the target side runs the market's job/session code
(`node/target/market.py`, `node/target/rounds.py`); the "drafter" answers the `open` with arbitrary wire bytes.
Whatever arrives, the round must return a valid proposal (or none) and never raise; a well-formed
draft is used only if it is for the round's k and its basis names the tokens really emitted.
"""

from __future__ import annotations

import contextlib
import time

import msgpack
import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st
from libp2p.io.exceptions import IOException
from libp2p.io.msgio import VarIntLengthMsgReadWriter
from libp2p.utils.varint import decode_varint_with_size, encode_uvarint

from market.ledger import Ledger
from market.policy import Policy
from market.registry import Registry
from node.target.market import MarketDrafting
from node.target.rounds import MarketProposer
from node.target.sessions import RemoteSession, RoundState
from p2p.messages import DRAFT_PROTOCOL_ID, MAX_FRAME_BYTES, TO_TARGET, Draft, InvalidMessage, decode
from tests.hostile_frames import DRAFT_BODY, frames_for
from verifier.params import SamplingParams

V = 4096
GAMMA = 4
CONTEXT = [0, 17, 99]  # the prompt [0], then the emitted tokens 17, 99: the round is at k = 2
START = 2
# The hostile side closes its stream once the round at k = 2 has asked, so a round ends at EOF or at
# the draft, not at the deadline; a generous one keeps a loaded CI machine from deciding the outcome.
DEADLINE_S = 5.0


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    with Ledger(tmp_path_factory.mktemp("fuzz") / "ledger.sqlite") as book:
        yield book


def expected_tokens(kind: str, wire: bytes, when: str) -> set[tuple[int, ...]]:
    """What the round at k = 2 may propose: the draft's tokens iff the frame is a valid draft for it.
    Sent ``early`` (after the prompt's open, before the round asked) a draft must name its basis: a
    draft without one answers the prompt's round, which is only sent (PREFILL_ALONE) and dropped,
    unless the target reads it only once the round at k = 2 has asked (a loaded machine): then it is
    that round's answer, as the same bytes sent a moment later would be. Both outcomes are right."""
    if kind != "whole":
        return {()}
    length, offset = decode_varint_with_size(wire)
    try:
        msg = decode(wire[offset : offset + length], vocab_size=V, max_gamma=GAMMA, allowed=TO_TARGET)
    except InvalidMessage:
        return {()}
    assert isinstance(msg, Draft)
    if msg.job != "job-1" or msg.start != START:
        return {()}
    if not msg.basis:
        return {msg.tokens} if when == "asked" else {(), msg.tokens}
    return {msg.tokens} if tuple(CONTEXT[-len(msg.basis) :]) == msg.basis else {()}


async def one_round(target, drafter, ledger: Ledger, wire: bytes, when: str):
    """The prompt's round, then the round at k = 2; the hostile side writes ``wire`` right after the
    open (``early``) or in answer to the round's advance (``asked``), then closes its stream at once."""

    async def hostile(stream) -> None:
        reader = VarIntLengthMsgReadWriter(stream, max_msg_size=MAX_FRAME_BYTES)
        await reader.read_msg()  # the open, for the prompt's round
        if when == "early":
            await stream.write(wire)
        with trio.move_on_after(DEADLINE_S), contextlib.suppress(IOException):  # (or the target hung up)
            await reader.read_msg()  # the advance to k = 2
        if when == "asked":
            await stream.write(wire)
        await stream.close_write()

    drafter.set_stream_handler(DRAFT_PROTOCOL_ID, hostile)
    registry, policy = Registry(), Policy()
    peer = str(drafter.get_id())
    registry.upsert(peer, [])
    registry.record_draft(peer, 1, 1, None)  # it matched before: off probation, its drafts are verified
    drafting = MarketDrafting(target, registry, policy, ledger, deadline_s=DEADLINE_S, max_drafters=1, vocab_size=V)
    async with drafting.job("job-1", SamplingParams(), 1, GAMMA) as proposer:
        assert proposer is not None

        def propose(context: list[int], start: int):
            return proposer.propose(context, start=start, gamma=GAMMA, params=SamplingParams(), seed=1)

        prompt_round = await trio.to_thread.run_sync(propose, CONTEXT[:1], 0)
        assert prompt_round.tokens == ()  # sent and decoded alone: nobody's draft is waited for
        proposal = await trio.to_thread.run_sync(propose, CONTEXT, START)
        session = proposer.sessions[0]
        with trio.fail_after(10):  # the hostile side closed: the session must end
            while session.alive:
                await trio.sleep(0.01)
    return proposal, registry.stats(peer)


VALID = ("whole", encode_uvarint(len(body := msgpack.packb(DRAFT_BODY))) + body)


# a valid draft followed at once by the end of its stream: both reads are ready together, and the
# draft must count whichever trio runs first (it did not when the stream's end was read first)
@example(frame=VALID, when="asked")
@example(frame=VALID, when="early")
@settings(max_examples=150, deadline=None)
@given(frame=frames_for(DRAFT_BODY), when=st.sampled_from(["early", "asked"]))
def test_hostile_draft_frames_never_crash_the_target(portal, hosts, ledger, frame, when):
    kind, wire = frame
    proposal, stats = portal.run(one_round, *hosts, ledger, wire, when)
    assert proposal.tokens in expected_tokens(kind, wire, when)
    assert all(0 <= t < V for t in proposal.tokens) and len(proposal.tokens) <= GAMMA
    if not proposal.tokens:
        assert stats.errors >= 1 or stats.timeouts >= 1  # the bad frame was seen and counted


def test_a_valid_draft_read_just_before_its_stream_ended_is_the_rounds_draft_succeeds():
    """The race the fuzz test found: the draft and the stream's end are read back to back, before
    the round's task wakes. The draft was whole and valid when it arrived: it counts, and the end is
    recorded against the drafter as before. It used to be dropped with the dead session."""
    registry = Registry()
    registry.upsert("d", [])
    registry.record_draft("d", 1, 1, None)  # off probation: its drafts are verified
    proposer = MarketProposer(
        [], job="job-1", params=SamplingParams(), seed=1, gamma=GAMMA, deadline_s=DEADLINE_S,
        registry=registry, policy=Policy(), prefill_alone=False,
    )  # fmt: skip
    session = RemoteSession("d", fs=None)  # never sent to or read from here: the reads are replayed
    proposer.sessions.append(session)
    proposer.round = RoundState(k=START, context=CONTEXT, gamma=GAMMA)
    proposer._take(session, Draft(job="job-1", start=START, tokens=(5, 6), basis=(), draft_ms=1.0), time.perf_counter())
    proposer._fail(session, "closed the stream")

    async def wait() -> bool:
        with trio.fail_after(1):  # the round does not wait for the dead drafter's deadline
            return await proposer._wait_for_drafts(["d"], trio.current_time() + DEADLINE_S)

    assert trio.run(wait) is False
    assert proposer._choose(["d"], deadline_passed=False).tokens == (5, 6)
    assert (registry.stats("d").errors, registry.stats("d").timeouts) == (1, 0)
