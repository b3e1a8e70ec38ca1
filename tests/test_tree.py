"""Trees of competing drafts (verifier.tree, verifier.lookup): merging, validation, the walk that
verifies a tree, the credit rule (first branch given owns a node; copies earn nothing), prompt lookup, and exactness:
the output distribution with trees is the target's (χ², the threshold and sample counts of
tests/test_exactness.py), and a tree decode is token for token the plain decode."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.stats import check_fit, samples_for_power
from tests.synthetic import MarkovLM, MarkovTreeLM, perturbed, random_table
from verifier.decode import decode_plain, decode_speculative
from verifier.errors import InvalidProposal
from verifier.lookup import PromptLookupProposer, TreeProposer, lookup_continuation
from verifier.params import SamplingParams, token_probs
from verifier.proposal import Proposal
from verifier.proposers import AdversarialProposer, LocalDraftProposer, RandomProposer
from verifier.tree import ROOT, DraftTree, credit, merge_drafts, validate_tree, verify_tree
from verifier.verify import Rule

GREEDY = SamplingParams(temperature=0.0)


def test_merging_shares_prefixes_and_keeps_the_first_owner():
    tree = merge_drafts([("a", [5, 6, 7]), ("b", [5, 6, 8]), ("c", [9]), ("d", [5, 6, 7])])
    assert tree.tokens == (5, 6, 7, 8, 9)
    assert tree.parents == (ROOT, 0, 1, 1, ROOT)
    assert tree.owners == ("a", "a", "a", "b", "c")  # d's copy of a's draft added no node
    assert tree.depths == (0, 1, 2, 2, 0)
    assert tree.child(1, 8) == 3 and tree.child(ROOT, 9) == 4 and tree.child(ROOT, 6) is None
    assert tree.first_branch() == Proposal((5, 6, 7))


def test_merging_stops_at_the_node_cap():
    tree = merge_drafts([("a", [1, 2, 3]), ("b", [4, 5, 6])], max_nodes=4)
    assert tree.tokens == (1, 2, 3, 4) and tree.owners == ("a", "a", "a", "b")


@pytest.mark.parametrize(
    "tree,why",
    [
        (DraftTree((1, 2), (ROOT, 5), ("a", "a")), "parent 5"),
        (DraftTree((1, 1), (ROOT, ROOT), ("a", "b")), "sibling"),
        (DraftTree((99,), (ROOT,), ("a",)), "vocabulary"),
        (DraftTree((1, 2, 3), (ROOT, 0, 1), ("a",) * 3), "exceeds γ"),
        (DraftTree((1,), (ROOT, 0), ("a",)), "parents"),
        (merge_drafts([("a", [1]), ("b", [2]), ("c", [3]), ("d", [4])]), "cap"),
        (Proposal((1,)), "expected a DraftTree"),
    ],
)
def test_malformed_trees_are_refused(tree, why):
    with pytest.raises(InvalidProposal, match=why):
        validate_tree(tree, gamma=2, vocab_size=10, max_nodes=3)


def one_hot_logits(rows: list[int], vocab: int = 10) -> np.ndarray:  # [len(rows), V]: greedy picks rows[i]
    logits = np.zeros((len(rows), vocab), dtype=np.float32)
    logits[np.arange(len(rows)), rows] = 10.0
    return logits


def test_verification_follows_the_targets_samples_down_the_tree():
    tree = merge_drafts([("a", [5, 6, 7]), ("b", [5, 6, 8]), ("c", [9])])  # nodes 5 6 7 8 9
    # the target's greedy tokens: after the root 5, after node 5 6, after 6 8, after 8 3
    logits = one_hot_logits([5, 6, 8, 0, 3, 0])  # rows: root, then nodes 0..4
    verdict = verify_tree(logits, tree, params=GREEDY, seed=0, start=0)
    assert verdict.tokens == (5, 6, 8, 3) and verdict.n_accepted == 3 and verdict.path == (0, 1, 3)
    miss = verify_tree(one_hot_logits([4, 0, 0, 0, 0, 0]), tree, params=GREEDY, seed=0, start=0)
    assert miss.tokens == (4,) and miss.n_accepted == 0 and miss.path == ()
    with pytest.raises(InvalidProposal, match="n\\+1"):
        verify_tree(logits[:3], tree, params=GREEDY, seed=0, start=0)


def test_credit_goes_to_the_first_proposer_of_each_accepted_token():
    tree = merge_drafts([("a", [5, 6, 7]), ("b", [5, 6, 8]), (None, [5, 9])])
    assert credit(tree, [5, 6, 8, 3]) == {"a": 2, "b": 1}  # b was first only with 8
    assert credit(tree, [5, 9, 1]) == {"a": 1}  # the target's own lookup branch earns nobody anything
    assert credit(tree, [4]) == {}


def test_two_drafters_sending_the_same_draft_earn_it_once():
    """A Sybil copy (or an honest duplicate) adds no node: the branch merged first earns every token."""
    same = [3, 1, 4]
    first = credit(merge_drafts([("honest", same), ("copy", same)]), [3, 1, 4, 1])
    assert first == {"honest": 3}
    swapped = credit(merge_drafts([("copy", same), ("honest", same)]), [3, 1, 4, 1])
    assert swapped == {"copy": 3}  # the merge order decides, not identity: the pay for the draft is the same
    assert sum(first.values()) == sum(swapped.values()) == 3


def test_prompt_lookup_proposes_what_followed_the_newest_match():
    context = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3]
    assert lookup_continuation(context, 3) == (5, 6, 7)  # "2 3" last seen before 5 6 7
    assert lookup_continuation([1, 2, 3, 8, 3], 2, max_ngram=3) == (8, 3)  # only "3" matches
    assert lookup_continuation([1, 2, 3], 4) == ()
    assert PromptLookupProposer().propose([7, 8, 7], start=0, gamma=2, params=GREEDY, seed=0).tokens == (8, 7)


V = 5
N_TOKENS = 3
TABLE = random_table(V, seed=11)
DRAFT_TABLE = perturbed(TABLE, seed=12)


def _joint_target_probs(params: SamplingParams) -> dict[tuple[int, ...], float]:
    cond = [token_probs(TABLE[prev], params) for prev in range(V)]
    return {
        seq: float(np.prod([cond[prev][tok] for prev, tok in zip((0, *seq[:-1]), seq, strict=True)]))
        for seq in itertools.product(range(V), repeat=N_TOKENS)
    }


@pytest.mark.slow(seconds=40)
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=3)])
def test_trees_are_exact(params):
    """An honest draft, a random one and an adversarial one, merged with a lookup branch: the
    output's distribution is the target's (Markov target, full loop: trees, rejections, bonus)."""
    target = MarkovTreeLM(TABLE)
    tree = TreeProposer(
        [LocalDraftProposer(MarkovLM(DRAFT_TABLE)), RandomProposer(V, rng_seed=5), AdversarialProposer(MarkovLM(TABLE))]
    )
    expected = _joint_target_probs(params)
    samples = [
        decode_speculative(target, tree, [0], params=params, seed=seed, max_new_tokens=N_TOKENS, gamma=2).tokens
        for seed in range(samples_for_power(expected))
    ]
    assert target.tree_passes > 0
    check_fit(samples, expected, f"trees/T={params.temperature}")


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9)])
def test_a_tree_decode_is_the_plain_decode(params):
    tree = TreeProposer([LocalDraftProposer(MarkovLM(DRAFT_TABLE)), RandomProposer(V, rng_seed=1)])
    for seed in range(20):
        plain = decode_plain(MarkovLM(TABLE), [0, 3], params=params, seed=seed, max_new_tokens=12).tokens
        target = MarkovTreeLM(TABLE)
        spec = decode_speculative(target, tree, [0, 3], params=params, seed=seed, max_new_tokens=12, gamma=3)
        assert spec.tokens == plain
        assert list(target.cached())[: 2 + len(plain) - 1] == [0, 3, *plain[:-1]]


def test_a_tree_on_a_target_without_trees_verifies_its_first_branch():
    tree = TreeProposer([LocalDraftProposer(MarkovLM(DRAFT_TABLE))], lookup=False)
    params = SamplingParams(temperature=1.0)
    plain = decode_plain(MarkovLM(TABLE), [0], params=params, seed=3, max_new_tokens=8).tokens
    spec = decode_speculative(MarkovLM(TABLE), tree, [0], params=params, seed=3, max_new_tokens=8, gamma=2)
    assert spec.tokens == plain and spec.stats.invalid_proposals == 0 and spec.stats.draft_tokens_accepted > 0
    # LEVIATHAN has no tree rule here and a tree carries no draft probabilities: every round decodes alone
    lev = decode_speculative(
        MarkovTreeLM(TABLE), tree, [0], params=params, seed=3, max_new_tokens=8, gamma=2, rule=Rule.LEVIATHAN
    )
    assert len(lev.tokens) == 8 and lev.stats.draft_tokens_proposed == 0 and lev.stats.invalid_proposals > 0
