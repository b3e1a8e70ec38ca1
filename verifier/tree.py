"""Trees of competing drafts: several drafts merged into one prefix tree and verified exactly.

Terms (as in verifier.verify, per path): a *node* is one draft token at one position, reached by a
unique prefix of draft tokens; the *root* is the last context token, whose logits give position
``start``; the *accepted path* is the longest root path whose every node equals the target's own
sample at its depth; the token after it is the recovered (or bonus) token.

Why this is exact with no extra rule: under Rule.GUMBEL the target's token at position k is
y_k = argmax(processed logits + G_k) with noise fixed by (seed, k) (verifier.verify). Walking the
tree from the root, the target samples y at the current node and moves to the child holding y, if
any. Every emitted token is y_k computed from the target's logits after the emitted prefix, so the
output is the target's plain decoding whatever the tree holds: drafts only decide how many tokens a
pass yields. SpecInfer (Miao et al. 2024, "SpecInfer: Accelerating LLM Serving with Tree-based
Speculative Inference and Verification") verifies token trees with a multi-step rejection rule to
stay exact under min(1, p/q); coupled noise needs none (Daliri, Musco & Suresh 2024).

Credit (who is paid for an accepted token): each node is *owned* by the branch that first put its
prefix into the tree, branches being merged in the order given (the market gives its rank order:
node.target.rounds). An accepted token earns its owner one credit; a later branch that repeats a
prefix adds no node and earns nothing for it, so copies of a draft (Sybil peers) gain nothing.
Branches the target adds itself (prompt lookup) have no owner and are merged after every
drafter's, so they never take a drafter's credit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from verifier.errors import InvalidProposal
from verifier.model import uncached
from verifier.params import SamplingParams
from verifier.proposal import Proposal
from verifier.verify import sample_token

ROOT = -1  # a node's parent when it is the first draft token (it follows the root: the context)
DEFAULT_TREE_NODES = 12  # nodes a round's tree holds unless configured (docs/target-performance.md: pass widths)
MAX_TREE_NODES = 32  # the most any proposer may send (a bound on one pass's width, as MAX_GAMMA is)


@dataclass(frozen=True)
class DraftTree:
    """A prefix tree of draft tokens, in insertion order (a parent before its children)."""

    tokens: tuple[int, ...]  # [n] each node's draft token
    parents: tuple[int, ...]  # [n] each node's parent: ROOT or an earlier node
    owners: tuple[str | None, ...]  # [n] the branch that first proposed the node (None: the target's own)

    @property
    def depths(self) -> tuple[int, ...]:
        return tuple(depths_below_root(self.parents))

    def child(self, node: int, token: int) -> int | None:
        """The child of ``node`` (ROOT for the first draft tokens) that holds ``token``, if any."""
        for i, (t, parent) in enumerate(zip(self.tokens, self.parents, strict=True)):
            if parent == node and t == token:
                return i
        return None

    def first_branch(self) -> Proposal:
        """The chain from the root through each node's first child: the first branch merged."""
        tokens, node = [], ROOT
        while (nxt := next((i for i, p in enumerate(self.parents) if p == node), None)) is not None:
            tokens.append(self.tokens[nxt])
            node = nxt
        return Proposal(tuple(tokens))


EMPTY_TREE = DraftTree((), (), ())


def depths_below_root(parents: Sequence[int]) -> list[int]:
    """Each node's depth (0 for a child of ROOT), where every parent is ROOT or an earlier node."""
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent == ROOT else depths[parent] + 1)
    return depths


Branch = tuple[str | None, Sequence[int]]  # (owner, draft tokens)


def merge_drafts(branches: Sequence[Branch], max_nodes: int = DEFAULT_TREE_NODES) -> DraftTree:
    """One prefix tree of ``branches`` ((owner, draft tokens), first owners first), with at most
    ``max_nodes`` nodes: a branch that does not fit is cut where the tree is full."""
    tokens: list[int] = []
    parents: list[int] = []
    owners: list[str | None] = []
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for owner, draft in branches:
        node = ROOT
        for token in draft:
            found = index.get((node, int(token)))
            if found is None:
                if len(tokens) >= max_nodes:
                    break
                found = index[(node, int(token))] = len(tokens)
                tokens.append(int(token))
                parents.append(node)
                owners.append(owner)
            node = found
    return DraftTree(tuple(tokens), tuple(parents), tuple(owners))


def validate_tree(raw: object, *, gamma: int, vocab_size: int, max_nodes: int) -> DraftTree:
    """A clean DraftTree, or InvalidProposal saying what is wrong (depth over γ, a token outside
    the vocabulary, a parent that is not earlier, two siblings with one token, too many nodes)."""
    if not isinstance(raw, DraftTree):
        raise InvalidProposal(f"expected a DraftTree, got {type(raw).__name__}")
    n = len(raw.tokens)
    if len(raw.parents) != n or len(raw.owners) != n:
        raise InvalidProposal(f"a tree of {n} tokens has {len(raw.parents)} parents and {len(raw.owners)} owners")
    if n > max_nodes:
        raise InvalidProposal(f"{n} tree nodes exceed the cap of {max_nodes}")
    seen: set[tuple[int, int]] = set()
    for i, (token, parent) in enumerate(zip(raw.tokens, raw.parents, strict=True)):
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= int(token) < vocab_size:
            raise InvalidProposal(f"tree node {i}: token {token!r} outside the vocabulary [0, {vocab_size})")
        if isinstance(parent, bool) or not isinstance(parent, int) or not ROOT <= parent < i:
            raise InvalidProposal(f"tree node {i}: parent {parent!r} is neither {ROOT} nor an earlier node")
        if (parent, int(token)) in seen:
            raise InvalidProposal(f"tree node {i}: a sibling already holds token {int(token)}")
        seen.add((parent, int(token)))
    if n and max(raw.depths) + 1 > gamma:
        raise InvalidProposal(f"a tree branch of {max(raw.depths) + 1} tokens exceeds γ = {gamma}")
    return raw


@dataclass(frozen=True)
class TreeVerdict:
    tokens: tuple[int, ...]  # the accepted tokens, then the recovered or bonus token
    n_accepted: int
    path: tuple[int, ...]  # the accepted nodes, root first


def verify_tree(
    target_logits: np.ndarray,  # [n+1, V]: row 0 after the context (the root), row 1 + i after node i
    tree: DraftTree,
    *,
    params: SamplingParams,
    seed: int,
    start: int,  # k of the first draft position (the root's next token)
) -> TreeVerdict:
    """Follow the tree from the root while the target's own sample at each depth is a child (pure)."""
    target_logits = np.asarray(target_logits)
    if target_logits.ndim != 2 or target_logits.shape[0] != len(tree.tokens) + 1:
        rows = len(tree.tokens) + 1
        raise InvalidProposal(f"target_logits must be [n+1, V] = [{rows}, V], got {target_logits.shape}")
    path: list[int] = []
    node = ROOT
    while True:
        target_token = sample_token(target_logits[node + 1], params, seed, start + len(path))
        nxt = tree.child(node, target_token)
        if nxt is None:  # recovered token (or bonus, past a leaf)
            return TreeVerdict((*(tree.tokens[i] for i in path), target_token), len(path), tuple(path))
        path.append(nxt)
        node = nxt


def accepted_path(tree: DraftTree, emitted: Sequence[int]) -> list[int]:
    """The nodes ``emitted`` (a round's tokens: accepted, then recovered or bonus) walks through
    from the root: under Rule.GUMBEL exactly the path that verification accepted."""
    path, node = [], ROOT
    for token in emitted:
        node = tree.child(node, token)
        if node is None:
            break
        path.append(node)
    return path


def accepted_length(tree: DraftTree, emitted: Sequence[int]) -> int:
    return len(accepted_path(tree, emitted))


def credit(tree: DraftTree, emitted: Sequence[int]) -> Counter[str]:
    """Accepted tokens per owner, from the round's ``emitted`` tokens (accepted, then recovered or
    bonus): under Rule.GUMBEL the nodes that ``emitted`` walks through from the root are exactly the
    accepted path, and each earns its owner one credit (see the module's docstring)."""
    return Counter(owner for node in accepted_path(tree, emitted) if (owner := tree.owners[node]) is not None)


def supports_trees(model: object) -> bool:
    """Whether ``model`` scores trees of rows (``extend_tree`` and ``keep_path``: the lean forward)."""
    return bool(getattr(model, "supports_trees", False))


def score_tree(model, context: Sequence[int], tree: DraftTree) -> tuple[np.ndarray, int, int]:
    """The logits after ``context`` and after each node of ``tree`` ([n+1, V]) in one pass of
    ``model.extend_tree``, the positions it scored, and how many context rows led them (for
    ``keep_accepted``)."""
    fresh = uncached(model, context)
    lead = len(fresh)  # the context's uncached rows, a chain; the tree hangs off the last of them
    parents = [ROOT, *range(lead - 1), *(lead - 1 if p == ROOT else lead + p for p in tree.parents)]
    logits = model.extend_tree([*fresh, *tree.tokens], parents)
    return logits[lead - 1 :], lead + len(tree.tokens), lead


def keep_accepted(model, lead: int, path: Sequence[int]) -> None:
    """After ``score_tree``: the cache keeps the context and the accepted nodes, nothing else."""
    model.keep_path([*range(lead), *(lead + node for node in path)])
