"""The target's intake of drafts (node.target.rounds): a reader per session, and where each draft
goes as it arrives: the round in flight, the session's early slot for a later round, or stale.

Whether a draft is usable is decided statelessly, when its round comes: start == the round's k and
basis == the tokens actually emitted there (``usable``). One early draft per session is kept (the
newest); one whose round never comes or whose basis is wrong is stale: ignored, not held against the
drafter and not measured.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from eth_utils import to_checksum_address

from node.target.draft_timing import DraftTiming
from node.target.sessions import MAX_DRAFTS_PER_MESSAGE, RemoteSession, RoundState, usable
from p2p.framing import StreamFailed
from p2p.messages import Draft, Error, InvalidMessage, Payout

log = logging.getLogger(__name__)

IDLE_READ_TIMEOUT_S = 600.0  # the reader waits for drafts for as long as the job lives


class DraftIntake:
    """Mixed into ``MarketProposer``: the drafts' way in. What a failure, a refusal or probation
    means is the proposer's (its ``_fail``, ``_refused`` and ``_on_probation``)."""

    job: str
    gamma: int
    round: RoundState
    drafts: DraftTiming
    sessions: list[RemoteSession]
    on_payout: Callable[[str], None] | None  # called with each payout address as it is named

    def live(self) -> list[RemoteSession]:
        return [s for s in self.sessions if s.alive]

    async def read_drafts(self, session: RemoteSession) -> None:
        """Background reader: one per session, so a read is never cancelled half-way."""
        while session.alive:
            try:
                msg = await session.fs.receive(IDLE_READ_TIMEOUT_S)
            except (StreamFailed, InvalidMessage) as exc:
                self._fail(session, str(exc))
                break
            if isinstance(msg, Error):  # the drafter is full: a refusal, not held against it
                self._refused(session, msg.message)
                break
            if isinstance(msg, Payout):
                if (why := self._payee(session, msg)) is not None:
                    self._fail(session, why)
                    break
                continue
            assert isinstance(msg, Draft)  # FrameStream(allowed=TO_TARGET) admits nothing else
            if msg.job != self.job or len(msg.tokens) > self.gamma:
                self._fail(session, f"draft for job {msg.job!r} of {len(msg.tokens)} tokens does not fit the session")
                break
            session.received += 1
            if session.received > MAX_DRAFTS_PER_MESSAGE * session.messages:
                self._fail(session, f"flooding: {session.received} drafts for {session.messages} messages")
                break
            self._take(session, msg, time.perf_counter())
        self.round.changed.set()

    def _payee(self, session: RemoteSession, msg: Payout) -> str | None:
        """Record where the drafter is paid; why the session fails, if it does (one payout per session,
        before any draft, for this job)."""
        if msg.job != self.job or session.payout is not None or session.received:
            return f"payout for job {msg.job!r} does not fit the session (one, before the first draft)"
        session.payout = to_checksum_address(msg.address)
        if self.on_payout is not None:  # a paying target funds the drafter's lane before its first draft
            self.on_payout(session.payout)
        return None

    def _take(self, session: RemoteSession, msg: Draft, now: float) -> None:
        """File one draft: for a later round (the session's early slot), for this round, or stale."""
        r = self.round
        if r.k < 0 and not msg.basis:  # the answer to a prompt sent before the prefill (PREFILL_ALONE): not
            return  # waited for; the drafter answers the next round from the same draft, trimmed
        if msg.start > r.k:  # an early draft; the newest replaces an older one that was never used
            if session.early is not None:
                self._stale(session, session.early, "replaced by a newer early draft")
            session.early = msg
            return
        if msg.start == r.k and session.pending is None and usable(msg, r.k, r.context) and self._open_to(session):
            latency = now - session.sent_at
            session.pending = (self._trimmed(msg), latency)
            session.misses = 0
            self.drafts.arrived(msg, latency)
            r.changed.set()
        elif msg.basis:
            self._stale(session, msg, self._why_not(session, msg))
        else:
            log.debug("job %s: stale draft from %s (k=%d, round k=%d)", self.job, session.peer_id, msg.start, r.k)

    def _promote_early(self, k: int, context: Sequence[int]) -> None:
        """Before asking: an early draft usable at this k is this round's draft, with no latency sample
        (it was there before the round asked; see docs/market.md on why it is not counted as 0)."""
        for session in self.live():
            draft = session.early
            if draft is None or draft.start > k:
                continue
            session.early = None
            if usable(draft, k, context):
                session.pending = (self._trimmed(draft), None)
                self.drafts.arrived(draft, None)
            else:
                self._stale(session, draft, "its basis is not what was emitted" if draft.start == k else "skipped")

    def _trimmed(self, draft: Draft) -> Draft:
        """The round's draft as it is judged and verified: its first γ tokens, at the round's γ (the
        last round of a job may ask for fewer than the session's)."""
        return replace(draft, tokens=draft.tokens[: self.round.gamma])

    def _open_to(self, session: RemoteSession) -> bool:
        """Is the round in flight still taking ``session``'s answer? Until it closes; a peer on
        probation's, until the round settles (its draft is only measured)."""
        return not self.round.closed or self._on_probation(session)

    def _why_not(self, session: RemoteSession, draft: Draft) -> str:
        r = self.round
        if draft.start < r.k:
            return "its round has passed"
        if session.pending is not None:
            return "its round had a draft already"
        if r.closed:
            return "its round had closed"
        return "its basis is not what was emitted"

    def _stale(self, session: RemoteSession, draft: Draft, why: str) -> None:
        self.drafts.stale += 1
        log.debug("job %s: stale early draft from %s at k=%d: %s", self.job, session.peer_id, draft.start, why)
