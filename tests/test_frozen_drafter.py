"""A drafter that hangs costs a job at most one draft deadline, its stream's opening and the
round's sends included.

The drafter process is frozen (SIGSTOP) after it registered: its connection stays up (the kernel
still acknowledges), but nothing answers on it, so opening a draft stream to it stalls until the
target's OPEN_TIMEOUT_S. A job used to open every stream before it started, and waited that long;
now the streams open while the job runs, and a round waits for one still opening only until its
own deadline. Against a real target process and a real drafter process on loopback.
"""

from __future__ import annotations

import os
import signal
import time

import trio
from netutil import complete, start_drafter, start_target, wait_for_drafters

from market.ledger import Ledger
from market.policy import Policy
from market.registry import Registry
from node.target.market import CLOSE_TIMEOUT_S, OPEN_TIMEOUT_S, MarketDrafting
from node.target.rounds import SEND_TIMEOUT_S, MarketProposer
from node.target.sessions import RemoteSession
from p2p.framing import StreamFailed
from verifier.params import SamplingParams

DEADLINE_MS = 60
MAX_TOKENS = 4  # a short answer: tens of milliseconds of decoding
PROMPT = "def parse_args(argv):\n"


def test_a_frozen_drafter_costs_a_job_at_most_a_deadline_succeeds(tmp_path):
    target = start_target(tmp_path, "--draft-deadline-ms", str(DEADLINE_MS), "--max-drafters", "1")
    drafter = start_drafter(tmp_path, target.lines["multiaddr"][0], "honest", "frozen")
    try:
        http = target.lines["http"][0]
        wait_for_drafters(http, 1)
        os.kill(drafter.proc.pid, signal.SIGSTOP)
        started = time.perf_counter()
        answer = complete(http, PROMPT, seed=1, max_tokens=MAX_TOKENS)["specmarket"]
        latency = time.perf_counter() - started
    finally:
        os.kill(drafter.proc.pid, signal.SIGKILL)
        drafter.proc.wait()
        target.stop()
    stats = answer["stats"]
    assert latency < OPEN_TIMEOUT_S, f"the job took {latency:.3f} s: it waited for the stream to open"
    assert len(answer["tokens"]) == MAX_TOKENS and stats["draft_tokens_proposed"] == 0, stats
    assert stats["draft_wait_ms_max"] <= DEADLINE_MS + 20, stats  # one round waited for the opening, no more


class UnreadStream:
    """A draft stream whose drafter never reads: each send waits for window space that never comes
    (on loopback a kernel buffer would take a long job to fill, so the stall is played here)."""

    async def send(self, message, timeout_s: float) -> None:
        try:
            with trio.fail_after(timeout_s):
                await trio.sleep_forever()
        except trio.TooSlowError:
            raise StreamFailed(f"no window for {timeout_s:g} s") from None

    async def receive(self, timeout_s: float):
        await trio.sleep_forever()


def test_a_drafter_that_never_reads_costs_a_round_at_most_its_deadline_succeeds():
    """The sends of a round share its deadline with the drafts: the round ends on time and drops
    the session (it used to wait SEND_TIMEOUT_S for the send, then the deadline for the drafts)."""
    session = RemoteSession("unread", UnreadStream())
    proposer = MarketProposer(
        [session], job="j", params=SamplingParams(), seed=0, gamma=4, deadline_s=DEADLINE_MS / 1000,
        registry=Registry(), policy=Policy(),
    )  # fmt: skip
    proposer.registry.upsert("unread", [])
    started = time.perf_counter()
    proposal = trio.run(proposer._round, [1, 2, 3], 0, 4)
    took = time.perf_counter() - started
    assert proposal.tokens == () and not session.alive, session.reason
    assert took < SEND_TIMEOUT_S, f"the round took {took:.3f} s"


class UnclosableStream:
    """A finished job's draft stream whose close, and the ``settle`` sent before it, never complete
    (a peer that stopped reading)."""

    async def send(self, message, timeout_s: float) -> None:
        await trio.sleep_forever()

    async def close(self) -> None:
        await trio.sleep_forever()


def test_a_finished_jobs_streams_close_without_holding_its_answer_succeeds(tmp_path):
    """The streams of a finished job close in the node's background nursery: the job's exit (and
    so its answer) never waits for them (it used to wait up to CLOSE_TIMEOUT_S)."""

    async def scenario() -> float:
        async with trio.open_nursery() as background:
            with Ledger(tmp_path / "ledger.sqlite") as ledger:
                drafting = MarketDrafting(
                    None, Registry(), Policy(), ledger, background=background, deadline_s=0.06, max_drafters=1,
                    vocab_size=64,
                )  # fmt: skip
                drafting.in_jobs["stuck"] = 1
                started = trio.current_time()
                await drafting._close("job-1", [RemoteSession("stuck", UnclosableStream())])
                took = trio.current_time() - started
            background.cancel_scope.cancel()
        return took

    took = trio.run(scenario)
    assert took < CLOSE_TIMEOUT_S / 2, f"closing the job took {took:.3f} s"
