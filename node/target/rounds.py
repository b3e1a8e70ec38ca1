"""Target side of the draft protocol: sessions with remote drafters and the proposer they feed.

Terms (as in verifier.verify): a round drafts γ tokens, the target verifies them in one pass and
emits the accepted draft tokens plus one recovered/bonus token. Under Rule.GUMBEL a draft token is
accepted iff it equals the token the target emits at that position, so the number of a draft's
tokens that *match* the emitted tokens is exactly what verification would have accepted. That lets
the market measure every drafter that answered in time, not only the one whose draft was verified.

The decode loop runs in a worker thread and calls ``MarketProposer.propose``, which hops into the
trio loop for one round: send ``advance`` to every live session, wait for drafts until the best
ranked drafter answers or the deadline passes, and return the best draft (or none: the target then
decodes the round alone, so a slow drafter costs at most one deadline per round). The first round
only sends the prompt (``open``) and is decoded alone: its pass is the prompt's prefill, during which
the drafters prefill and draft their first block (``PREFILL_ALONE``).

Drafting overlaps verification: while the target verifies a block, a drafter may already send an
*early draft* for a later round, naming the tokens it assumes were emitted before it (its basis);
where each draft goes as it arrives is ``node.target.intake``'s business.

A drafter on probation (no matched token in its trial window: ``Policy.on_probation``) is asked like
any other, but its draft is never verified and the round does not wait for it: it may arrive until
the round's deadline, while the round's pass runs, and is measured when the round settles (which
waits out what is left of the deadline for it, if anything). The round's tokens reach the client
only after that (``hold_stream``), so no probation draft that counts can copy them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import trio

from market.policy import Policy
from market.registry import Registry
from node.target.client_drafts import JobRegistry
from node.target.config import PREFILL_ALONE, WAIT_BUDGET_SHARE
from node.target.draft_timing import MAX_ROUND_RECORDS, MS, DraftTiming, RoundRecord
from node.target.intake import DraftIntake
from node.target.sessions import RemoteSession, RoundState
from node.target.wait_budget import WaitBudget
from p2p.framing import StreamFailed
from p2p.messages import MAX_OPEN_DEADLINE_MS, UNPAID, Advance, InvalidMessage, Open, PayTerms
from verifier.lookup import TREE_LOOKUP_MIN_NGRAM, lookup_continuation
from verifier.model import common_prefix
from verifier.params import SamplingParams
from verifier.proposal import EMPTY, MAX_GAMMA, Proposal
from verifier.tree import Branch, DraftTree, accepted_length, credit, merge_drafts, supports_trees

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 1.0
MAX_MISSES_PER_JOB = 2  # consecutive missed deadlines before a session is dropped for the job
MAX_REFILLS_PER_JOB = 2  # replacement drafters a job asks for once all of its drafters were dropped
HOLD_POLL_S = 0.002  # how often a held stream looks again for the round's probation answers


class MarketProposer(DraftIntake, WaitBudget):
    """The Proposer for one job; ``propose`` is called from the decode worker thread."""

    name = "market"

    def __init__(
        self,
        sessions: list[RemoteSession],
        *,
        job: str,
        params: SamplingParams,
        seed: int,
        gamma: int,
        deadline_s: float,
        registry: Registry | JobRegistry,  # JobRegistry: the job's client drafts (node.target.client_drafts)
        policy: Policy,
        wait_budget: float = WAIT_BUDGET_SHARE,
        prefill_alone: bool = PREFILL_ALONE,
        terms: PayTerms = UNPAID,
        tree_nodes: int = 0,
    ) -> None:
        self.sessions = sessions
        # > 0: every drafter's answer (and a prompt-lookup branch of the target's own) merged into one
        # tree of at most this many nodes (verifier.tree); 0, or a target that scores no trees: the
        # best-ranked drafter's draft alone
        self.tree_nodes = tree_nodes
        self.lookup_accepted = 0  # accepted tokens that only the target's own lookup branch proposed
        self.terms = terms  # announced in every open: what an accepted draft token earns, from where
        # the next round only sends the context: the prompt's round (prefill alone), or a round whose
        # new drafter (a refill) catches up on the context while the target decodes alone
        self.send_only = prefill_alone
        self.refill: Callable[[], bool] | None = None  # asks for a replacement drafter (MarketDrafting)
        self.client: RemoteSession | None = None  # the job's client, drafting for itself (node.target.client_drafts)
        self.on_payout: Callable[[str], None] | None = None  # funds a payee's lane (MarketDrafting)
        self.refills = 0
        self.wait_budget = wait_budget  # 0: never stop waiting (see _over_budget)
        self.job, self.params, self.seed, self.gamma = job, params, seed, gamma
        self.deadline_s = deadline_s
        self.registry, self.policy = registry, policy
        self.round = RoundState()
        self.wait_s = 0.0  # time the decode loop spent in propose(): sending, waiting for drafts
        self.rounds = 0
        self.empty_rounds = 0  # rounds with no usable draft (deadline passed, or no drafter left)
        self.probation_rounds = 0  # ... of which every drafter asked was on probation (none to verify)
        self.started = time.perf_counter()
        self.wasted_s = 0.0  # waiting in rounds whose draft gave no accepted token (or that had none)
        self.last_wait_s = 0.0  # the wait of the round in flight, judged wasted or not when it settles
        self.stopped_at: int | None = None  # the round from which the job decodes alone (the budget)
        self.passes = None  # the job's TimedModel, once the engine hands it over (watch_passes)
        self.prompt_len: int | None = None  # learned in the first round: the job's output follows it
        self.emitted = 0  # the job's output tokens, counted when it finishes (finish)
        self.drafts = DraftTiming()  # round trips, the drafters' reported time, early hits and stale ones
        self.opening = 0  # sessions whose stream is still opening: they join when it opens (join)
        self.records: list[RoundRecord] = []  # one per settled round (node.target.draft_timing)

    # -- called from the worker thread ------------------------------------------------------
    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int):
        if self.stopped_at is not None or not (self.opening or self.live() or self._may_refill()):  # the budget
            self.rounds, self.empty_rounds = self.rounds + 1, self.empty_rounds + 1  # stopped it, or no drafter
            return EMPTY
        return trio.from_thread.run(self._round, list(context), start, gamma)

    def _may_refill(self) -> bool:
        return self.refill is not None and self.refills < MAX_REFILLS_PER_JOB

    def join(self, session: RemoteSession) -> None:
        """A session whose stream opened while the job ran: it drafts from the next round it is sent."""
        self.sessions.append(session)
        self.round.changed.set()

    # -- trio side ----------------------------------------------------------------------------
    def _by_peer(self) -> dict[str, RemoteSession]:
        return {s.peer_id: s for s in self.sessions}

    async def _round(self, context: list[int], k: int, gamma: int) -> Proposal:
        self.prompt_len = len(context) - k if self.prompt_len is None else self.prompt_len
        await self._await_probation()
        self._settle(context)
        started = time.perf_counter()
        if self._over_budget(started, k) is not False:  # (once stopped, propose() no longer hops here)
            self.round = RoundState()
            self.rounds += 1
            self.empty_rounds += 1
            return EMPTY
        if not (self.opening or self.live()) and self._may_refill():  # every drafter of the job was dropped
            self.refills += 1
            if self.refill():
                self.send_only = True  # judged from the next round: its prefill is no deadline's business
            else:
                self.refills = MAX_REFILLS_PER_JOB  # nobody left to ask: no more hops for that
        ends = trio.current_time() + self.deadline_s  # streams still opening, the sends, the drafts: one deadline
        if self.send_only:
            self.round = RoundState()  # an answer to this round's open is not waited for (see _take)
            await self._send_all(context, k, ends)
            self.send_only = False
            self.wait_s += time.perf_counter() - started  # not a draft round: no record, nobody judged
            return EMPTY
        self.round = RoundState(k=k, context=context, gamma=gamma, ends=ends)
        self._promote_early(k, context)
        await self._send_all(context, k, ends)
        live = self.live()
        trusted = [s.peer_id for s in live if not self._on_probation(s)]
        ranked = self.policy.rank(self.registry, trusted, explore=False)
        deadline_passed = await self._wait_for_drafts(ranked, ends)
        proposal = self._choose(ranked, deadline_passed)
        self.last_wait_s = self.round.wait_s = time.perf_counter() - started
        self.wait_s += self.last_wait_s
        self.drafts.waited(self.last_wait_s)
        self.rounds += 1
        self.empty_rounds += not proposal.tokens
        self.round.probation = bool(live) and not trusted
        self.probation_rounds += self.round.probation
        return proposal

    async def _send_all(self, context: list[int], k: int, ends: float) -> None:
        """The round's context to every live session (an open or an advance), within the deadline."""
        await self._wait_until(lambda: not self.opening, ends)
        live = self.live()
        with trio.move_on_at(ends):
            async with trio.open_nursery() as nursery:
                for session in live:
                    nursery.start_soon(self._send_update, session, context, k)
        for session in live:
            if session.alive and session.synced < len(context):  # a drafter that does not read
                self._fail(session, "the context was not sent within the round's deadline")

    async def _send_update(self, session: RemoteSession, context: list[int], k: int) -> None:
        if session.synced == 0:
            deadline_ms = min(MAX_OPEN_DEADLINE_MS, round(self.deadline_s * MS))
            t = UNPAID if session is self.client else self.terms
            msg = Open(
                self.job, tuple(context), *self._params(), self.seed, self.gamma, k, t.price_wei, deadline_ms,
                t.chain_id, t.escrow, t.operator, t.lane, t.max_pay_wei,
            )  # fmt: skip
        else:  # with the drafter's accepted tokens so far, so it can check its pay
            msg = Advance(self.job, tuple(context[session.synced :]), k, session.accepted)
        # before the send: a draft may be read while the send is still under way (an early draft)
        session.messages, session.sent_at = session.messages + 1, time.perf_counter()
        try:
            await session.fs.send(msg, SEND_TIMEOUT_S)
        except (StreamFailed, InvalidMessage) as exc:
            self._fail(session, f"send failed: {exc}")
            return
        session.synced = len(context)

    def _params(self) -> tuple[float, int, float]:
        return self.params.temperature, self.params.top_k, self.params.top_p

    async def _wait_until(self, done, ends: float) -> bool:
        """Until ``done()`` holds (False) or the round's deadline ``ends`` passes (True)."""
        with trio.move_on_at(ends) as scope:
            while not done():
                self.round.changed = trio.Event()
                await self.round.changed.wait()
        return scope.cancelled_caught

    async def _wait_for_drafts(self, ranked: list[str], ends: float) -> bool:
        """Until the best-ranked live drafter has answered, all have, or the deadline passes (True)."""
        by_peer = self._by_peer()

        def answered() -> bool:  # a draft that arrived before its stream ended still counts (see _choose)
            waiting = [by_peer[p] for p in ranked if by_peer[p].alive or by_peer[p].pending is not None]
            return not waiting or waiting[0].pending is not None or all(s.pending for s in waiting)

        return await self._wait_until(answered, ends)

    def _choose(self, ranked: list[str], deadline_passed: bool) -> Proposal:
        """Close the round: a drafter that has not answered missed the deadline, or, when the round
        closed early on the best-ranked draft, was merely late (recorded, not held against it).
        A valid draft read before its stream ended (the drafter closed it, or sent garbage next) is
        still the round's draft: it was whole and checked when it arrived, and the target verifies it
        like any other; whether it counts must not depend on which of the two reads trio ran first."""
        by_peer = self._by_peer()
        self.round.closed = True
        for session in self.sessions:
            if session.pending is not None:
                session.misses = 0
            elif session.alive and self._on_probation(session):
                continue  # not waited for: it may answer until the deadline (_await_probation)
            elif session.alive and deadline_passed:
                self._miss(session)
            elif session.alive:
                self.registry.record_late(session.peer_id)
        for peer in ranked:
            session = by_peer[peer]
            if session.pending is not None and session.pending[0].tokens:
                self.round.chosen, self.round.chosen_draft = peer, session.pending
                break
        else:
            self.round.chosen = None
        return self._proposal(ranked)

    def _proposal(self, ranked: list[str]) -> Proposal | DraftTree:
        """What the round verifies: the chosen draft alone, or with trees every trusted answer in the
        policy's rank order (the best-ranked owns a shared prefix: verifier.tree's credit rule) and the
        target's own prompt-lookup branch, merged."""
        r = self.round
        if not self.tree_nodes:
            tokens = r.chosen_draft[0].tokens if r.chosen is not None and r.chosen_draft else ()
            r.tree = merge_drafts([(r.chosen, tokens)], max_nodes=MAX_GAMMA)
            return Proposal(tokens) if tokens else EMPTY
        by_peer = self._by_peer()
        answered = [by_peer[peer] for peer in ranked if by_peer[peer].pending is not None]
        branches: list[Branch] = [(s.peer_id, s.pending[0].tokens) for s in answered]
        branches.append((None, lookup_continuation(r.context, r.gamma, min_ngram=TREE_LOOKUP_MIN_NGRAM)))
        r.tree = merge_drafts(branches, self.tree_nodes)
        return r.tree if r.tree.tokens else EMPTY

    def _on_probation(self, session: RemoteSession) -> bool:
        """The job's own client never is: only its own answer is at stake (node.target.client_drafts)."""
        return session is not self.client and self.policy.on_probation(self.registry.stats(session.peer_id))

    def _silent_on_probation(self, r: RoundState) -> list[RemoteSession]:
        """The peers on probation that round ``r`` asked and that have not answered it."""
        asked = [s for s in self.sessions if s.alive and s.pending is None and s.synced == len(r.context)]
        return [s for s in asked if self._on_probation(s)]

    async def hold_stream(self) -> None:
        """Before the tokens of the round in flight go out to the client (the engine streams them):
        until every peer on probation that the round asked has answered, the round's deadline has
        passed, or the round settled. The round does not wait for such a peer, so its answer may come
        after the round's pass; were the round's tokens out by then, a drafter colluding with the
        client (or being it) could copy them and leave probation at will (issue 40 §6). The next round
        waits for the same answers before it asks (``_await_probation``), so the hold costs the job no
        time: it only moves when those tokens reach the client, by what is left of one deadline."""
        r = self.round
        if r.k < 0 or not self._silent_on_probation(r):
            return
        with trio.move_on_at(r.ends):
            while self.round is r and self._silent_on_probation(r):
                await trio.sleep(HOLD_POLL_S)  # a poll: _wait_until's event has one waiter, the round

    async def _await_probation(self) -> None:
        """Before the round in flight settles: what is left of its deadline for the drafts of peers
        on probation that it asked and that have not answered (the pass usually covered it); one
        still silent then missed the round. The wait counts as the round's."""
        r = self.round
        if r.k < 0 or not self._silent_on_probation(r):
            return
        started = time.perf_counter()
        if await self._wait_until(lambda: not self._silent_on_probation(r), r.ends):
            for session in self._silent_on_probation(r):
                self._miss(session)
        waited = time.perf_counter() - started
        r.wait_s += waited
        self.last_wait_s += waited
        self.wait_s += waited

    def _miss(self, session: RemoteSession) -> None:
        session.misses += 1
        self.registry.record_timeout(session.peer_id)
        self.policy.update(self.registry, session.peer_id)
        if session.misses >= MAX_MISSES_PER_JOB:
            session.kill(f"missed {session.misses} deadlines of {self.deadline_s * 1000:.0f} ms")
            log.info("job %s: dropping drafter %s: %s", self.job, session.peer_id, session.reason)

    def _fail(self, session: RemoteSession, reason: str) -> None:
        if not session.alive:
            return
        session.kill(reason)
        log.warning("job %s: dropping the stream of drafter %s: %s", self.job, session.peer_id, reason)
        self.registry.record_error(session.peer_id, reason)
        self.policy.update(self.registry, session.peer_id)

    def _refused(self, session: RemoteSession, reason: str) -> None:
        if session.alive:
            session.kill(f"refused: {reason}")
            log.info("job %s: drafter %s refused the session: %s", self.job, session.peer_id, reason[:200])
            self.registry.record_refusal(session.peer_id, reason)
            self.policy.update(self.registry, session.peer_id)  # an untried peer that keeps refusing is benched

    def _settle(self, context: Sequence[int]) -> None:
        """Score the drafts of the round that just ended against the tokens it emitted."""
        r = self.round
        if r.k < 0:
            return
        emitted = context[len(r.context) :]  # every pending draft starts at r.k: measured at its own positions
        credits = credit(r.tree, emitted)  # accepted tokens per drafter: the first to propose each
        r.accepted = accepted_length(r.tree, emitted)  # the target's lookup branch's included
        self.lookup_accepted += r.accepted - sum(credits.values())
        verified = set(r.tree.owners)
        for session in self.sessions:
            if session.pending is None:
                continue
            draft, latency = session.pending
            session.pending = None
            matched = common_prefix(draft.tokens, emitted)
            session.proposed += len(draft.tokens)
            self.registry.record_draft(session.peer_id, len(draft.tokens), matched, latency, offered=r.gamma)
            if session.peer_id in verified:
                session.accepted += credits[session.peer_id]
                self.registry.record_accepted(session.peer_id, credits[session.peer_id])
            self._judged(session)
        if not r.accepted:
            self.wasted_s += self.last_wait_s
        if len(self.records) < MAX_ROUND_RECORDS:
            verify_s = self.passes.pass_seconds[-1] if self.passes is not None and self.passes.pass_seconds else 0.0
            self.records.append(RoundRecord.of(r, verify_s))

    def _judged(self, session: RemoteSession) -> None:
        """After a draft of the session's was scored: the policy's verdict, and a benched one is dropped."""
        self.policy.update(self.registry, session.peer_id)
        if session.alive and self.policy.is_benched(self.registry.stats(session.peer_id)):
            session.kill("benched by the market policy")
            log.info("job %s: drafter %s benched; not asking it again", self.job, session.peer_id)

    def watch_passes(self, passes) -> None:
        """The job's timed target (``TimedModel``): its prefill and one-position pass times; and
        whether it scores trees."""
        self.passes = passes
        if not supports_trees(passes):
            self.tree_nodes = 0

    def timing(self) -> dict[str, float | int]:
        """Drafting overheads of this job, for the response's stats."""
        return {
            "draft_rounds": self.rounds,
            "draft_empty_rounds": self.empty_rounds,
            "draft_probation_rounds": self.probation_rounds,
            "draft_wait_seconds": round(self.wait_s, 4),
            "draft_wait_ms_per_round": round(1000 * self.wait_s / self.rounds, 3) if self.rounds else 0.0,
            "draft_wasted_wait_seconds": round(self.wasted_s, 4),
            "plain_estimate_seconds": round(self._plain_seconds(self.emitted) or 0.0, 4),
            "draft_budget_stopped_at_round": -1 if self.stopped_at is None else self.stopped_at,
            "draft_refills": self.refills,
            "lookup_tokens_accepted": self.lookup_accepted,
            **self._client_timing(),
            **self.drafts.stats(),
        }

    def _client_timing(self) -> dict[str, int]:
        """A drafting client's own account: its draft tokens received in time, and accepted."""
        c = self.client
        return {} if c is None else {"client_draft_tokens": c.proposed, "client_tokens_accepted": c.accepted}

    def round_records(self) -> list[dict[str, float | int | str]]:
        return [r.to_json() for r in self.records]

    def finish(self, context: Sequence[int]) -> dict[str, int]:
        """Settle the last round against the final output; per-drafter accepted tokens."""
        self._settle(context)
        if self.prompt_len is not None:
            self.emitted = len(context) - self.prompt_len
        self.round = RoundState()
        return {s.peer_id: s.accepted for s in self.sessions if s.accepted and s is not self.client}
