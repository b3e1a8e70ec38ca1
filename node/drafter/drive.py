"""One draft session's drafting loop, on whatever stream carries it: a drafter peer's draft stream
(node.drafter.peer) or a client's own generate stream (node.client.drafting).

Plan the next step (``DraftSession.next_step``), grow the path in a worker thread, send the draft as
the session's behaviour says (honest, or one of the hostile ones of node.drafter.strategies), and
wait for an advance when nothing is needed. The stream's reader, run beside it, feeds the session
its advances.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

import trio
from libp2p.utils.varint import encode_uvarint

from node.drafter.session import DraftSession, Kind, Step
from node.drafter.strategies import forge, garbage_frames
from p2p.framing import FrameStream, StreamFailed

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 5.0


async def drive(fs: FrameStream, session: DraftSession, vocab_size: int) -> None:
    """Draft what the session needs next and send it; wait for an advance when nothing is needed.
    Runs until cancelled, or until a send fails (``StreamFailed``)."""
    while True:
        step = session.next_step()
        if step is None:
            session.changed = trio.Event()
            await session.changed.wait()
        elif len(session.path) < step.need:
            await _extend(session, step)  # then plan again: an advance may have come meanwhile
        else:
            await _send(fs, session, step, vocab_size)


async def _extend(session: DraftSession, step: Step) -> None:
    epoch, cancel, interrupt, k = session.epoch, session.cancel, session.interrupt, session.k
    ext = session.extension(step)
    drafted = await trio.to_thread.run_sync(session.draft_tokens, ext, cancel, interrupt)
    session.extended(epoch, drafted, ext.count, cancel, k)
    if epoch != session.epoch:
        log.debug(
            "job %s: dropped %d of %d draft tokens at k=%d: stale work",
            session.job, len(drafted.tokens), ext.count, ext.start,
        )  # fmt: skip


async def _send(fs: FrameStream, session: DraftSession, step: Step, vocab_size: int) -> None:
    b = session.behaviour
    draft, since = session.draft_for(step)
    if b.empty:  # stall: no early drafts, and every answer empty, just before the deadline
        if step.kind is Kind.EARLY:
            session.mark_sent(draft, since, time.perf_counter())
            return
        draft = replace(draft, tokens=())
    if b.delay_s:
        await trio.sleep(b.delay_s)  # slow: the state may move on meanwhile; the draft goes out stale
    if b.forge_basis:
        draft = forge(draft, vocab_size)
    draft = session.mark_sent(draft, since, time.perf_counter())
    if b.garbage:
        await _send_garbage(fs, session, vocab_size)
    else:
        for _ in range(b.copies):
            await fs.send(draft, SEND_TIMEOUT_S)
        session.tokens_sent += len(draft.tokens)
    kind = "early draft" if step.kind is Kind.EARLY else "answer"
    log.debug("job %s: sent %s of %d tokens at k=%d", session.job, kind, len(draft.tokens), draft.start)
    if b.drop_after is not None and session.drafts_sent >= b.drop_after:
        log.info("job %s: dropping the connection on purpose (flaky)", session.job)
        # shielded: the reader sees the stream end at once, and libp2p's clean-up of the connection
        # runs inside this call; cancelled half-way, the dead connection would stay in the swarm
        with trio.move_on_after(SEND_TIMEOUT_S, shield=True):
            await fs.stream.muxed_conn.close()
        raise StreamFailed("connection dropped on purpose (flaky)")


async def _send_garbage(fs: FrameStream, session: DraftSession, vocab_size: int) -> None:
    frames = garbage_frames(session.job, session.k, vocab_size)
    body = frames[session.garbage_index % len(frames)]
    session.garbage_index += 1
    log.info("job %s: sending a malformed frame (%d bytes) on purpose", session.job, len(body))
    with trio.fail_after(SEND_TIMEOUT_S):
        await fs.stream.write(encode_uvarint(len(body)) + body)
