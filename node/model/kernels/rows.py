"""Where a pass's rows sit: a chain (each row after the one before it) or a tree of drafts.

A pass appends its rows to a job's KV cache at positions start, start + 1, ... in row order. In a
chain, row m is the token at sequence position start + m and sees every cached key before it. In a
tree (competing drafts merged into one prefix tree, issue 25), row m is a node: its sequence
position is start + its depth, and it sees the cache before ``start`` plus its ancestors' rows,
root first, then its own (SpecInfer's tree attention: Miao et al. 2024). Scored this way a node
goes through exactly the operations of its path scored as a chain, so its logits are the chain's
bit for bit wherever the forward is shape-invariant (tests/test_tree_forward.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verifier.tree import ROOT, depths_below_root


class TreeShapeError(ValueError):
    """Parents that do not describe a tree of rows in order (each parent an earlier row or ROOT)."""


def depths_of(parents: Sequence[int]) -> list[int]:
    """Each row's depth below the cache (0 for a row whose parent is ROOT: it follows the cache);
    TreeShapeError unless every parent is ROOT or an earlier row."""
    for m, parent in enumerate(parents):
        if isinstance(parent, bool) or not isinstance(parent, int) or not ROOT <= parent < m:
            raise TreeShapeError(f"row {m}: parent {parent!r} is neither {ROOT} nor an earlier row")
    return depths_below_root(parents)


@dataclass(frozen=True)
class RowLayout:
    """The rows of one pass of one job. ``offsets`` [rows + 1] and ``visible`` (int32) list, for a
    tree, the cache positions each row sees past ``start`` (skinny_gemm.c's skinny_tree_attention);
    both are None for a chain."""

    start: int
    depths: tuple[int, ...]
    offsets: torch.Tensor | None = None
    visible: torch.Tensor | None = None

    @classmethod
    def chain(cls, start: int, rows: int) -> RowLayout:
        return cls(start, tuple(range(rows)))

    @classmethod
    def tree(cls, start: int, parents: Sequence[int]) -> RowLayout:
        depths = depths_of(parents)
        if all(p == m - 1 for m, p in enumerate(parents)):
            return cls.chain(start, len(parents))  # a chain: the plain kernel, the same bits
        offsets, visible = [0], []
        for m, parent in enumerate(parents):
            seen = [] if parent == ROOT else visible[offsets[parent] : offsets[parent + 1]]
            visible.extend([*seen, start + m])
            offsets.append(len(visible))
        as_int = dict(dtype=torch.int32)
        return cls(start, tuple(depths), torch.tensor(offsets, **as_int), torch.tensor(visible, **as_int))

    @property
    def rows(self) -> int:
        return len(self.depths)

    @property
    def is_chain(self) -> bool:
        return self.visible is None

    def rotary(self, weights) -> tuple[torch.Tensor, torch.Tensor]:  # each [rows, head_dim]
        """RoPE's cos and sin at each row's sequence position (start + depth)."""
        cos, sin = weights.rotary(self.start, self.start + max(self.depths) + 1)
        if self.is_chain:
            return cos, sin
        index = torch.tensor(self.depths, dtype=torch.long)
        return cos.index_select(0, index).contiguous(), sin.index_select(0, index).contiguous()
