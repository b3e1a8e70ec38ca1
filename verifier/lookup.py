"""Drafts that cost no model: prompt lookup, and a proposer that merges several drafts into a tree.

Prompt lookup decoding (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding; the n-gram
candidate generator of HF's ``prompt_lookup_num_tokens``): find the context's last n tokens
earlier in the context (the prompt and the output so far) and propose what followed them there.
Departure: the most recent earlier occurrence is taken rather than the first, since code and chat
outputs tend to repeat what they wrote last.
"""

from __future__ import annotations

from collections.abc import Sequence

from verifier.params import SamplingParams
from verifier.proposal import Proposal
from verifier.tree import DEFAULT_TREE_NODES, merge_drafts

MAX_LOOKUP_NGRAM = 3  # the longest context suffix searched for (HF's default max_matching_ngram_size is 2)
# the target's own branch in a tree needs a 3-token match. Measured on the qwen pair's bench prompts
# (8 prompts, 64 tokens, greedy, γ = 4; draft alone 3.652 tokens and 4 nodes a pass, 122 ms a token):
# with 1- or 2-token matches the tree took 3.679 tokens a pass for 4.7 / 4.43 nodes, and each extra
# node widens a pass that is already compute-bound (124-141 ms a token); with 3-token matches it
# added 0.25 nodes a pass at the draft's own speed (121.7 ms). docs/target-performance.md
TREE_LOOKUP_MIN_NGRAM = 3
LOOKUP_SPAN = 4096  # context tokens searched at most, the newest: bounds a round's lookup cost


def lookup_continuation(
    context: Sequence[int], gamma: int, max_ngram: int = MAX_LOOKUP_NGRAM, min_ngram: int = 1
) -> tuple[int, ...]:
    """Up to ``gamma`` tokens that followed the most recent earlier occurrence of the context's
    longest suffix of ``max_ngram`` .. ``min_ngram`` tokens (empty when no such suffix occurs earlier)."""
    window = list(context[-LOOKUP_SPAN:])
    n_ctx = len(window)
    for n in range(min(max_ngram, n_ctx - 1), min_ngram - 1, -1):
        suffix = window[-n:]
        for i in range(n_ctx - n - 1, -1, -1):  # the match window[i : i + n], newest first
            if window[i : i + n] == suffix:
                return tuple(window[i + n : i + n + gamma])
    return ()


class PromptLookupProposer:
    """Drafts by prompt lookup: free, and right wherever the output repeats its context."""

    name = "lookup"

    def __init__(self, max_ngram: int = MAX_LOOKUP_NGRAM) -> None:
        self.max_ngram = max_ngram

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int) -> Proposal:
        return Proposal(lookup_continuation(context, gamma, self.max_ngram))


class TreeProposer:
    """Several proposers' drafts as one tree (verifier.tree), each branch owned by its proposer's
    name, merged in the order given; with ``lookup``, a prompt-lookup branch of the target's own
    (no owner) is merged last. In-process: benchmarks and tests of trees (the market builds its
    trees from its drafters' answers: node.target.rounds)."""

    name = "tree"

    def __init__(self, proposers: Sequence, *, lookup: bool = True, max_nodes: int = DEFAULT_TREE_NODES) -> None:
        self.proposers, self.lookup, self.max_nodes = list(proposers), lookup, max_nodes

    def propose(self, context: Sequence[int], *, start: int, gamma: int, params: SamplingParams, seed: int):
        branches = [
            (p.name, p.propose(context, start=start, gamma=gamma, params=params, seed=seed).tokens)
            for p in self.proposers
        ]
        if self.lookup:
            branches.append((None, lookup_continuation(context, gamma, min_ngram=TREE_LOOKUP_MIN_NGRAM)))
        return merge_drafts(branches, self.max_nodes)
