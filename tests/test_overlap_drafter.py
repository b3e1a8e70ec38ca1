"""The drafter's side of overlapping drafting, against a scripted target over real libp2p.

A real drafter (``DrafterNode.handle_stream`` with the shipped draft model) serves a stream opened by
a second libp2p host in the same trio loop, which plays the target message by message. Its drafts
are compared with what the honest proposer drafts from scratch for the same context, seed and k.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair

from node.drafter.config import DrafterConfig
from node.drafter.peer import DrafterNode
from node.drafter.session import ANSWER_SHARE, LINK_MARGIN_S, DraftSession, Kind, Step
from node.drafter.strategies import Behaviour
from p2p.framing import FrameStream
from p2p.host import make_host, parse_listen, parse_peer_addr, peer_addrs
from p2p.messages import DRAFT_PROTOCOL_ID, TO_TARGET, Advance, Draft, Open
from verifier.params import SamplingParams
from verifier.proposers import LocalDraftProposer

GAMMA = 4
SEED = 7
PROMPT = "def parse(self, text):\n"
READ_TIMEOUT_S = 30.0
QUIET_S = 0.5  # no further frame within this long: the drafter sent nothing more
ADAPTIVE = "adaptive"  # the drafter whose blocks end at a token below MIN_CONFIDENCE
MIN_CONFIDENCE = 0.5


@pytest.fixture(scope="module")
def link(portal, tmp_path_factory):
    """(target-side host, drafter peer id, the DrafterNode): the drafter's handler on a real host."""
    own = make_host(create_new_key_pair())
    fake_bootstrap = f"/ip4/127.0.0.1/tcp/1/p2p/{own.get_id()}"  # parsed, never dialled: no rendezvous here
    drafters: dict[object, DrafterNode] = {}
    kinds = {True: (True, 0.0), False: (False, 0.0), ADAPTIVE: (True, MIN_CONFIDENCE)}  # (overlap, confidence)

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        hosts = {}
        for kind, (overlap, confidence) in kinds.items():
            cfg = DrafterConfig(
                bootstrap=fake_bootstrap,
                data_dir=tmp_path_factory.mktemp("d"),
                overlap=overlap,
                pair="tiny",
                min_confidence=confidence,
            )
            drafters[kind] = DrafterNode(cfg)
            hosts[kind] = make_host(create_new_key_pair())
            hosts[kind].set_stream_handler(DRAFT_PROTOCOL_ID, drafters[kind].handle_stream)
        listen = [parse_listen("/ip4/127.0.0.1/tcp/0")]
        async with own.run(listen_addrs=listen), contextlib.AsyncExitStack() as stack:
            for h in hosts.values():
                await stack.enter_async_context(h.run(listen_addrs=listen))
                await own.connect(parse_peer_addr(peer_addrs(h)[0]))
            task_status.started({o: (h.get_id(), drafters[o]) for o, h in hosts.items()})
            await trio.sleep_forever()

    peers, stop = portal.start(run)
    yield own, peers
    stop()


async def _session(own, peer, vocab: int, script):
    stream = await own.new_stream(peer, [DRAFT_PROTOCOL_ID])
    fs = FrameStream(stream, vocab_size=vocab, allowed=TO_TARGET, max_gamma=GAMMA)
    try:
        return await script(fs)
    finally:
        await fs.close()


async def _next(fs: FrameStream) -> Draft:
    msg = await fs.receive(READ_TIMEOUT_S)
    assert isinstance(msg, Draft)
    return msg


async def _quiet(fs: FrameStream) -> bool:
    with trio.move_on_after(QUIET_S):
        await fs.receive(READ_TIMEOUT_S)
        return False
    return True


def fresh_draft(pair, context: list[int], k: int, n: int) -> tuple[int, ...]:
    """What the honest proposer drafts from scratch (a fresh cache) for n tokens at k."""
    return fresh_proposal(pair, context, k, n).tokens


def fresh_proposal(pair, context: list[int], k: int, n: int):
    proposer = LocalDraftProposer(pair.draft.fork())
    return proposer.propose(context, start=k, gamma=n, params=SamplingParams(), seed=SEED)


def block_length(confidence: list[float], begin: int) -> int:
    """The block from ``begin``: up to and including the first token below MIN_CONFIDENCE, at most γ."""
    for i in range(begin, begin + GAMMA):
        if confidence[i] < MIN_CONFIDENCE:
            return i - begin + 1
    return GAMMA


def test_overlap_answer_then_early_draft_and_a_hit_needs_no_answer(portal, link, pair):
    own, peers = link
    peer, node = peers[True]
    context = pair.tokenizer.encode(PROMPT)

    async def script(fs: FrameStream):
        await fs.send(Open("job-hit", tuple(context), 1.0, 0, 1.0, SEED, GAMMA, 0), 5.0)
        answer, early = await _next(fs), await _next(fs)
        basis = early.basis  # the drafter assumed its answer and its predicted bonus: send exactly that
        await fs.send(Advance("job-hit", basis, len(basis)), 5.0)
        after = await _next(fs)
        return answer, early, after, await _quiet(fs)

    answer, early, after, quiet = portal.run(_session, own, peer, node.model.vocab_size, script)
    path = fresh_draft(pair, context, 0, 3 * GAMMA + 2)
    assert (answer.start, answer.basis, answer.tokens) == (0, (), path[:GAMMA])
    assert (
        early.start == GAMMA + 1
        and early.basis == path[: GAMMA + 1]
        and early.tokens == path[GAMMA + 1 : 2 * GAMMA + 1]
    )
    # a hit: the early draft was the answer for k = γ+1; the next frame is already the next early draft
    assert after.start == 2 * GAMMA + 2 and after.basis == path[GAMMA + 1 : 2 * GAMMA + 2], after
    assert after.tokens == path[2 * GAMMA + 2 : 3 * GAMMA + 2]
    assert quiet, "the drafter sent a second frame for one advance after a hit"
    assert 0 <= answer.draft_ms < 10_000 and 0 <= early.draft_ms < 10_000


def test_after_a_rejection_stale_work_is_dropped_and_the_new_k_gets_a_plain_answer(portal, link, pair):
    own, peers = link
    peer, node = peers[True]
    context = pair.tokenizer.encode(PROMPT)

    async def script(fs: FrameStream):
        await fs.send(Open("job-miss", tuple(context), 1.0, 0, 1.0, SEED, GAMMA, 0), 5.0)
        answer = await _next(fs)
        # the target accepted the first draft token and recovered another one at k = 1
        emitted = (answer.tokens[0], (answer.tokens[1] + 1) % node.model.vocab_size)
        await fs.send(Advance("job-miss", emitted, 2), 5.0)
        frames = [await _next(fs)]
        while frames[-1].start != 2:
            frames.append(await _next(fs))
        frames.append(await _next(fs))
        return emitted, frames, await _quiet(fs)

    emitted, frames, quiet = portal.run(_session, own, peer, node.model.vocab_size, script)
    *before, plain, early = frames
    assert all(f.start == GAMMA + 1 for f in before), before  # at most the early draft sent before the advance
    new_context = [*context, *emitted]
    path = fresh_draft(pair, new_context, 2, 2 * GAMMA + 1)
    assert (plain.start, plain.basis, plain.tokens) == (2, (), path[:GAMMA])  # fresh work for the new k
    assert early.start == 2 + GAMMA + 1 and early.basis == path[: GAMMA + 1]
    assert quiet


def test_without_overlap_one_plain_answer_per_message(portal, link, pair):
    own, peers = link
    peer, node = peers[False]
    context = pair.tokenizer.encode(PROMPT)

    async def script(fs: FrameStream):
        await fs.send(Open("job-plain", tuple(context), 0.0, 0, 1.0, SEED, GAMMA, 0), 5.0)
        first = await _next(fs)
        quiet_after_open = await _quiet(fs)
        await fs.send(Advance("job-plain", (*first.tokens, 5), GAMMA + 1), 5.0)
        second = await _next(fs)
        return first, quiet_after_open, second, await _quiet(fs)

    first, quiet_after_open, second, quiet = portal.run(_session, own, peer, node.model.vocab_size, script)
    assert (first.start, first.basis, len(first.tokens)) == (0, (), GAMMA) and quiet_after_open
    assert (second.start, second.basis, len(second.tokens)) == (GAMMA + 1, (), GAMMA) and quiet


def test_adaptive_blocks_end_at_the_first_unsure_token_and_the_early_draft_follows_it(portal, link, pair):
    own, peers = link
    peer, node = peers[ADAPTIVE]
    context = pair.tokenizer.encode(PROMPT)

    async def script(fs: FrameStream):
        await fs.send(Open("job-adaptive", tuple(context), 1.0, 0, 1.0, SEED, GAMMA, 0), 5.0)
        return await _next(fs), await _next(fs)

    answer, early = portal.run(_session, own, peer, node.model.vocab_size, script)
    fresh = fresh_proposal(pair, context, 0, 3 * GAMMA + 2)
    confidence = list(fresh.confidence)
    n = block_length(confidence, 0)
    n_early = block_length(confidence, n + 1)
    assert n < GAMMA or n_early < GAMMA, f"no block was cut short (confidence {confidence}): pick another PROMPT"
    assert (answer.start, answer.basis, answer.tokens) == (0, (), fresh.tokens[:n])
    assert early.start == n + 1 and early.basis == fresh.tokens[: n + 1]  # the answer, then its predicted bonus
    assert early.tokens == fresh.tokens[n + 1 : n + 1 + n_early]


class CancellingProposer(LocalDraftProposer):
    """The honest proposer on the real draft model, which raises the session's cancel flag while it
    drafts its ``at``-th token, as a contradicting advance read by the other task would."""

    def __init__(self, model, at: int, flag: threading.Event) -> None:
        super().__init__(model)
        self.calls, self.at, self.flag = 0, at, flag

    def propose(self, context, **kwargs):
        self.calls += 1
        if self.calls == self.at:
            self.flag.set()
        return super().propose(context, **kwargs)


def test_a_contradicting_advance_stops_the_block_at_the_next_token(pair):
    context = pair.tokenizer.encode(PROMPT)
    flag = threading.Event()
    proposer = CancellingProposer(pair.draft.fork(), at=3, flag=flag)
    session = DraftSession("j", list(context), SamplingParams(), SEED, GAMMA, 0, proposer, Behaviour(), 512)
    session.path = list(fresh_draft(pair, context, 0, GAMMA))
    session.confidence = [1.0] * GAMMA
    epoch, cancel = session.epoch, session.cancel
    ext = session.extension(Step(Kind.EARLY, 2 * GAMMA + 1))
    drafted = session.draft_tokens(ext, flag)
    assert len(drafted.tokens) == 3 and proposer.calls == 3  # the token in progress is finished, no further one
    # on the trio side, an advance that contradicts the path drops it and raises the flag of its block
    session.advance(Advance("j", ((session.path[0] + 1) % 4096,), 1), 0.0)
    assert cancel.is_set() and session.path == [] and session.epoch == epoch + 1
    session.extended(epoch, drafted, ext.count, cancel, 0)
    assert session.path == []  # the stale block is discarded, not appended to the new path


class SleepyProposer(LocalDraftProposer):
    """The honest proposer on the real draft model, taking ``token_s`` a token: a draft slower than
    the target's deadline allows for a whole block (as the 0.5B draft is beside the exact target)."""

    def __init__(self, model, token_s: float) -> None:
        super().__init__(model)
        self.token_s, self.calls = token_s, 0

    def propose(self, context, **kwargs):
        self.calls += 1
        time.sleep(self.token_s)
        return super().propose(context, **kwargs)


SLOW_TOKEN_S = 0.1
SLOW_DEADLINE_S = 0.45  # a whole block of GAMMA tokens takes 0.4 s: too long for its clock, 0.36 s


def test_an_answer_to_an_advance_goes_out_before_the_deadline_with_the_tokens_drafted_by_then(pair):
    """The promise to an honest drafter: a draft too slow for a whole block before the target's deadline
    still answers in time (a late answer misses its round, and misses in a row bench the drafter)."""
    context = pair.tokenizer.encode(PROMPT)
    proposer = SleepyProposer(pair.draft.fork(), SLOW_TOKEN_S)
    session = DraftSession("j", list(context), SamplingParams(), SEED, GAMMA, 0, proposer, Behaviour(), 512)
    session.deadline_s = SLOW_DEADLINE_S
    session.answered, session.answer_len = 0, 0  # the open's answer was sent (and had no clock)
    session.advance(Advance("j", (5,), 1), time.perf_counter())  # a rejection: nothing drafted for k = 1
    step = session.next_step()
    assert step == Step(Kind.ANSWER, GAMMA)
    ext = session.extension(step)
    drafted = session.draft_tokens(ext, session.cancel, session.interrupt)
    took = time.perf_counter() - session.asked_at
    assert drafted.timed_out and 1 <= len(drafted.tokens) < GAMMA, drafted
    assert took < SLOW_DEADLINE_S, f"the answer was ready {took:.3f} s after the advance"
    session.extended(session.epoch, drafted, ext.count, session.cancel, 1)
    step = session.next_step()
    assert step == Step(Kind.ANSWER, len(drafted.tokens))  # nothing more to draft: send it as it is
    draft, _ = session.draft_for(step)
    assert (draft.start, draft.basis, draft.tokens) == (1, (), tuple(drafted.tokens))
    assert draft.tokens == fresh_draft(pair, [*context, 5], 1, len(drafted.tokens))  # the honest tokens


def test_without_a_stated_deadline_and_for_early_drafts_blocks_have_no_clock(pair):
    context = pair.tokenizer.encode(PROMPT)
    session = DraftSession(
        "j", list(context), SamplingParams(), SEED, GAMMA, 0, SleepyProposer(pair.draft.fork(), 0.0), Behaviour(), 512
    )
    session.advance(Advance("j", (5,), 1), 0.0)  # asked long ago
    assert session.extension(Step(Kind.ANSWER, GAMMA)).until == float("inf")  # an open with deadline_ms 0
    session.deadline_s = SLOW_DEADLINE_S
    assert session.extension(Step(Kind.ANSWER, GAMMA)).until == ANSWER_SHARE * SLOW_DEADLINE_S
    assert session.extension(Step(Kind.EARLY, 2 * GAMMA + 1)).until == float("inf")
    session.link_rtt_s = 0.01  # a link shorter than the share leaves: the share holds
    assert session.extension(Step(Kind.ANSWER, GAMMA)).until == ANSWER_SHARE * SLOW_DEADLINE_S
    session.link_rtt_s = SLOW_DEADLINE_S / 2  # a drafter far from its target (a client across a slow link)
    until = SLOW_DEADLINE_S - SLOW_DEADLINE_S / 2 - LINK_MARGIN_S
    assert session.extension(Step(Kind.ANSWER, GAMMA)).until == pytest.approx(until)
    assert session.extension(Step(Kind.EARLY, 2 * GAMMA + 1)).until == float("inf")  # early drafts: no clock


def test_an_advance_interrupts_an_early_block_and_its_tokens_are_kept(pair):
    """An advance read while an early block is drafted: the worker returns at the next token (so the
    new round's answer does not wait for the rest of the block), and what it drafted stays on the path."""
    context = pair.tokenizer.encode(PROMPT)
    session = DraftSession("j", list(context), SamplingParams(), SEED, GAMMA, 0, None, Behaviour(), 512)
    proposer = CancellingProposer(pair.draft.fork(), at=2, flag=session.interrupt)
    session.proposer = proposer
    session.path = list(fresh_draft(pair, context, 0, GAMMA))
    session.confidence = [1.0] * GAMMA
    epoch, cancel = session.epoch, session.cancel
    ext = session.extension(Step(Kind.EARLY, 2 * GAMMA + 1))
    drafted = session.draft_tokens(ext, cancel, session.interrupt)
    assert drafted.interrupted and len(drafted.tokens) == 2 and proposer.calls == 2
    session.extended(epoch, drafted, ext.count, cancel, 0)
    assert session.path == list(fresh_draft(pair, context, 0, GAMMA + 2)) and session.short_at == -1
