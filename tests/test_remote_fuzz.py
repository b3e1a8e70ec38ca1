"""The target's side of the draft protocol under hypothesis-generated hostile drafts.

A real libp2p host pair in one trio loop: the target side runs the market's job/session code
(`node/target/market.py`, `node/target/rounds.py`); the "drafter" answers the `open` with arbitrary wire bytes.
Whatever arrives, the round must return a valid proposal (or none) and never raise; a well-formed
draft is used only if it is for the round's k and its basis names the tokens really emitted.
"""

from __future__ import annotations

import pytest
import trio
from hypothesis import given, settings
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.io.msgio import VarIntLengthMsgReadWriter
from libp2p.utils.varint import decode_varint_with_size

from market.ledger import Ledger
from market.policy import Policy
from market.registry import Registry
from node.target.market import MarketDrafting
from p2p.host import make_host, parse_listen, parse_peer_addr, peer_addrs
from p2p.messages import DRAFT_PROTOCOL_ID, MAX_FRAME_BYTES, TO_TARGET, Draft, InvalidMessage, decode
from tests.hostile_frames import DRAFT_BODY, frames_for
from verifier.params import SamplingParams

V = 4096
GAMMA = 4
CONTEXT = [0, 17, 99]  # the prompt [0], then the emitted tokens 17, 99: the round is at k = 2
START = 2


@pytest.fixture(scope="module")
def hosts(portal):
    """(target-side host, hostile drafter host), connected over loopback with Noise."""

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        target, drafter = make_host(create_new_key_pair()), make_host(create_new_key_pair())
        listen = [parse_listen("/ip4/127.0.0.1/tcp/0")]
        async with target.run(listen_addrs=listen), drafter.run(listen_addrs=listen):
            await target.connect(parse_peer_addr(peer_addrs(drafter)[0]))
            task_status.started((target, drafter))
            await trio.sleep_forever()

    value, stop = portal.start(run)
    yield value
    stop()


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    with Ledger(tmp_path_factory.mktemp("fuzz") / "ledger.sqlite") as book:
        yield book


def expected_tokens(kind: str, wire: bytes) -> tuple[int, ...]:
    """What the round must propose: the draft's tokens iff the frame is a valid draft for it."""
    if kind != "whole":
        return ()
    length, offset = decode_varint_with_size(wire)
    try:
        msg = decode(wire[offset : offset + length], vocab_size=V, max_gamma=GAMMA, allowed=TO_TARGET)
    except InvalidMessage:
        return ()
    assert isinstance(msg, Draft)
    basis_ok = not msg.basis or tuple(CONTEXT[-len(msg.basis) :]) == msg.basis
    return msg.tokens if msg.job == "job-1" and msg.start == START and basis_ok else ()


async def one_round(target, drafter, ledger: Ledger, wire: bytes):
    async def hostile(stream) -> None:
        await VarIntLengthMsgReadWriter(stream, max_msg_size=MAX_FRAME_BYTES).read_msg()  # the open
        await stream.write(wire)
        await stream.close_write()

    drafter.set_stream_handler(DRAFT_PROTOCOL_ID, hostile)
    registry, policy = Registry(), Policy()
    peer = str(drafter.get_id())
    registry.upsert(peer, [])
    drafting = MarketDrafting(target, registry, policy, ledger, deadline_s=0.5, max_drafters=1, vocab_size=V)
    async with drafting.job("job-1", SamplingParams(), 1, GAMMA) as proposer:
        assert proposer is not None
        proposal = await trio.to_thread.run_sync(
            lambda: proposer.propose(CONTEXT, start=START, gamma=GAMMA, params=SamplingParams(), seed=1)
        )
        session = proposer.sessions[0]
        with trio.fail_after(10):  # the hostile side closed: the session must end
            while session.alive:
                await trio.sleep(0.01)
    return proposal, registry.stats(peer)


@settings(max_examples=150, deadline=None)
@given(frame=frames_for(DRAFT_BODY))
def test_hostile_draft_frames_never_crash_the_target(portal, hosts, ledger, frame):
    kind, wire = frame
    proposal, stats = portal.run(one_round, *hosts, ledger, wire)
    assert proposal.tokens == expected_tokens(kind, wire)
    assert all(0 <= t < V for t in proposal.tokens) and len(proposal.tokens) <= GAMMA
    if not proposal.tokens:
        assert stats.errors >= 1 or stats.timeouts >= 1  # the bad frame was seen and counted
