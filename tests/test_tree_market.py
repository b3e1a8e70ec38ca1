"""The market's trees (node.target.rounds with --tree-nodes): every trusted drafter's answer to a
round and a prompt-lookup branch of the target's own are merged into one tree in the policy's rank
order, and each accepted token is credited to the best-ranked drafter that proposed it
(verifier.tree). The attacks: a drafter that copies another's draft (or a Sybil running the same
draft twice) to be paid twice, and a cheap drafter that answers at once with a likely token to take
the credit from the drafter that did the work; neither earns what a better-ranked drafter already
proposed. With trees as without, a round closes once the best-ranked drafter has answered: a
slower drafter's draft joins the tree only if it is already there, so it never costs the round
time. The round's sessions are driven directly (their drafts set as the intake files them), with
the market's real registry, policy and settle."""

from __future__ import annotations

import trio

from market.policy import Policy
from market.registry import Registry
from node.target.rounds import MarketProposer
from node.target.sessions import RemoteSession, RoundState
from p2p.messages import Draft
from verifier.params import SamplingParams
from verifier.proposal import Proposal
from verifier.tree import DraftTree

GAMMA = 4
CONTEXT = [0, 17, 99]  # the prompt [0], then 17 and 99 (k counts from the prompt's one token)


def round_with(drafts: list[tuple[str, tuple[int, ...]]], tree_nodes: int, emitted: list[int], context=CONTEXT):
    """One round after ``context`` whose drafters answered ``drafts``, best-ranked first; the target
    then emitted ``emitted``. The verified proposal, each drafter's accepted count once the round
    settled, and the round's records."""
    registry = Registry()
    for peer, _ in drafts:
        registry.upsert(peer, [])
    proposer = MarketProposer(
        [], job="j", params=SamplingParams(), seed=1, gamma=GAMMA, deadline_s=1.0, registry=registry,
        policy=Policy(), tree_nodes=tree_nodes,
    )  # fmt: skip
    proposer.round = RoundState(k=len(context) - 1, context=context, gamma=GAMMA)
    for peer, tokens in reversed(drafts):  # (the sessions' order is not the rank order)
        session = RemoteSession(peer, fs=None, synced=len(context))
        session.pending = (Draft("j", len(context) - 1, tokens, (), 1.0), 0.01)
        proposer.sessions.append(session)
    proposal = proposer._choose([peer for peer, _ in drafts], deadline_passed=False)
    proposer._settle([*context, *emitted])
    return proposal, {s.peer_id: s.accepted for s in proposer.sessions}, proposer.round_records()


def test_a_copy_of_a_draft_earns_nothing():
    same = (5, 6, 7)
    proposal, accepted, _ = round_with([("best", same), ("copy", same)], 12, [5, 6, 7, 8])
    assert isinstance(proposal, DraftTree) and proposal.owners[:3] == ("best",) * 3
    assert accepted == {"best": 3, "copy": 0}
    _, swapped, _ = round_with([("copy", same), ("best", same)], 12, [5, 6, 7, 8])
    assert swapped == {"copy": 3, "best": 0}  # whoever ranks first: the pay for the tokens is the same


def test_a_cheap_guess_takes_no_credit_from_a_better_ranked_drafter():
    """A drafter that answers at once with one likely token (no model: it is always first to arrive)
    ranks below an honest drafter, so the token both proposed is the honest drafter's."""
    _, accepted, _ = round_with([("honest", (5, 6, 7)), ("guesser", (5,))], 12, [5, 6, 7, 1])
    assert accepted == {"honest": 3, "guesser": 0}


def test_each_drafter_earns_the_accepted_tokens_it_proposed_first():
    _, accepted, records = round_with([("a", (5, 6, 9)), ("b", (5, 6, 7, 8))], 12, [5, 6, 7, 8, 1])
    assert accepted == {"a": 2, "b": 2}  # a ranks first and had 5 6; b alone had 7 8
    assert records[0]["accepted"] == 4


def test_tokens_only_the_targets_lookup_found_earn_nobody_anything():
    """The context ends 3 17 99, which came before 5 6 2 earlier: the lookup branch proposes 5 6 2 3,
    which the drafter did not; the target accepts 5 6 and pays for neither."""
    context = [0, 3, 17, 99, 5, 6, 2, 3, 17, 99]
    proposal, accepted, records = round_with([("a", (4,))], 12, [5, 6, 7], context)
    assert isinstance(proposal, DraftTree) and None in proposal.owners
    assert accepted == {"a": 0} and records[0]["accepted"] == 2


def test_without_trees_the_best_ranked_draft_is_verified_alone():
    proposal, accepted, _ = round_with([("a", (5, 9)), ("b", (5, 6, 7))], 0, [5, 6, 7, 8])
    assert proposal == Proposal((5, 9))  # "b"'s draft, though better, is not verified
    assert accepted == {"a": 1, "b": 0}


SLOW_S, DEADLINE_S = 0.2, 2.0


def wait_with_a_slow_second(tree_nodes: int, second_answers: bool = True, first_answers: bool = True):
    """The best-ranked drafter has answered (or never does); the second answers after SLOW_S (or
    never). Whether the round's deadline (DEADLINE_S / 4) passed, and how long the round waited."""
    proposer = MarketProposer(
        [], job="j", params=SamplingParams(), seed=1, gamma=GAMMA, deadline_s=DEADLINE_S, registry=Registry(),
        policy=Policy(), tree_nodes=tree_nodes,
    )  # fmt: skip
    fast, slow = RemoteSession("fast", fs=None), RemoteSession("slow", fs=None)
    fast.pending = (Draft("j", 2, (5,), (), 1.0), 0.001) if first_answers else None
    proposer.sessions = [fast, slow]

    async def scenario() -> tuple[bool, float]:
        proposer.round = RoundState(k=2, context=CONTEXT, gamma=GAMMA)

        async def answer() -> None:
            await trio.sleep(SLOW_S)
            slow.pending = (Draft("j", 2, (5, 6, 7), (), 1.0), SLOW_S)
            proposer.round.changed.set()

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            if second_answers:
                nursery.start_soon(answer)
            passed = await proposer._wait_for_drafts(["fast", "slow"], started + DEADLINE_S / 4)
            waited = trio.current_time() - started
            nursery.cancel_scope.cancel()
        return passed, waited

    return trio.run(scenario)


def test_with_trees_a_round_closes_on_the_best_ranked_answer_and_no_drafter_costs_past_the_deadline():
    for tree_nodes in (12, 0):
        passed, waited = wait_with_a_slow_second(tree_nodes)
        assert not passed and waited < SLOW_S  # the slower drafter is late, not waited for
        passed, waited = wait_with_a_slow_second(tree_nodes, second_answers=False)
        assert not passed and waited < SLOW_S
        passed, waited = wait_with_a_slow_second(tree_nodes, first_answers=False)  # the best-ranked is silent
        assert passed and DEADLINE_S / 4 <= waited < DEADLINE_S / 2  # the deadline, and no longer
