"""Tree attention on the served kernel (the packed qwen2.5-coder target): every node of a tree of
drafts, scored in one pass, has bit for bit the logits of its path scored as a chain; alone and in
a shared pass with other jobs; the cache then keeps only the accepted path, so the next pass is the
chain's too; and a decode whose rounds verify trees (the 0.5B draft and a prompt-lookup branch)
emits exactly plain decoding's tokens."""

from __future__ import annotations

import numpy as np
import pytest

from node.model.kernels.batch import extend_batch
from node.model.kernels.rows import ROOT, TreeShapeError
from verifier.decode import decode_plain, decode_speculative
from verifier.lookup import TreeProposer
from verifier.params import SamplingParams
from verifier.proposers import LocalDraftProposer, RandomProposer
from verifier.tree import merge_drafts

pytestmark = pytest.mark.slow(seconds=60)

PROMPT = [151644, 872, 198, 5501, 14, 9707, 11, 1879]
# four branches in merge order; shared prefixes, a lone branch, one of full depth
BRANCHES = [("a", [2661, 3110, 13, 1077]), ("b", [2661, 3110, 525]), ("c", [40, 1079]), ("d", [2661, 8, 9])]


@pytest.fixture(scope="module")
def pair():
    from node.lab.bench_local import load_lab_pair

    return load_lab_pair("qwen2.5-coder")


def path_of(tree, node: int) -> list[int]:
    tokens = []
    while node != ROOT:
        tokens.append(tree.tokens[node])
        node = tree.parents[node]
    return tokens[::-1]


def chain_logits(target, prefix: list[int], path: list[int]) -> np.ndarray:  # [V]: after the path
    job = target.fork()
    job.extend(prefix)
    return job.extend(path)[-1]


def tree_rows(tree, lead: int) -> list[int]:
    """Parents of a pass whose first ``lead`` rows are a chain and whose tree hangs off the last."""
    return [ROOT, *range(lead - 1), *(lead - 1 if p == ROOT else lead + p for p in tree.parents)]


def test_every_node_of_a_tree_is_its_path_scored_as_a_chain(pair):
    target, tree = pair.target, merge_drafts(BRANCHES)
    job = target.fork()
    job.extend(PROMPT[:5])
    lead = PROMPT[5:]  # three context rows in the same pass, then the tree
    logits = job.extend_tree([*lead, *tree.tokens], tree_rows(tree, len(lead)))
    for node in range(len(tree.tokens)):
        expected = chain_logits(target, PROMPT[:5], [*lead, *path_of(tree, node)])
        assert np.array_equal(logits[len(lead) + node], expected), f"node {node}: tree attention changed its bits"
    assert np.array_equal(logits[len(lead) - 1], chain_logits(target, PROMPT[:5], lead))


def test_the_cache_keeps_the_accepted_path_and_the_next_pass_is_the_chains(pair):
    target, tree = pair.target, merge_drafts(BRANCHES)
    accepted = [2661, 3110, 525]  # b's branch: nodes 0, 1, 4, off the first chain
    job = target.fork()
    job.extend(PROMPT)
    job.extend_tree(tree.tokens, list(tree.parents))
    job.keep_path([0, 1, 4])
    assert list(job.cached()) == PROMPT + accepted
    chain = target.fork()
    chain.extend(PROMPT + accepted)
    assert np.array_equal(job.extend([7, 8]), chain.extend([7, 8]))
    with pytest.raises(TreeShapeError):
        job.keep_path([0])  # no tree in flight any more: the chain's pass cleared it
    with pytest.raises(TreeShapeError, match="parent"):
        job.extend_tree([1, 2], [ROOT, 3])


def test_a_tree_left_uncut_keeps_only_its_leading_chain(pair):
    job = pair.target.fork()
    job.extend(PROMPT)
    job.extend_tree([5, 6, 7], [ROOT, 0, ROOT])  # rows 0 and 1 sit where a chain's would
    assert list(job.cached()) == [*PROMPT, 5, 6]


def test_trees_share_a_pass_with_other_jobs_bit_for_bit(pair):
    target, tree = pair.target, merge_drafts(BRANCHES)
    solo = target.fork()
    solo.extend(PROMPT)
    expected = solo.extend_tree(tree.tokens, list(tree.parents))
    other_expected = chain_logits(target, PROMPT[:3], [9707, 11])
    a, b = target.fork(), target.fork()
    a.extend(PROMPT)
    b.extend(PROMPT[:3])
    got_b, got_a = extend_batch([b, a], [[9707, 11], list(tree.tokens)], [None, list(tree.parents)])
    assert np.array_equal(got_a, expected) and np.array_equal(got_b[-1], other_expected)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_decode_verifying_trees_is_plain_decoding(pair, temperature):
    params = SamplingParams(temperature=temperature)
    prompt = [*PROMPT, *PROMPT[3:]]  # repeats itself, so the lookup branch has something to find
    plain = decode_plain(pair.target.fork(), prompt, params=params, seed=7, max_new_tokens=16).tokens
    proposer = TreeProposer([LocalDraftProposer(pair.draft.fork()), RandomProposer(pair.target.vocab_size)])
    tree = decode_speculative(pair.target.fork(), proposer, prompt, params=params, seed=7, max_new_tokens=16, gamma=4)
    assert tree.tokens == plain
    assert tree.stats.draft_tokens_accepted > 0
