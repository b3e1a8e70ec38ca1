"""One forward pass over several jobs' new tokens: batched verification (issue 25, step 1).

A memory-bound target reads every weight once per pass, whatever its width, so the rows of every
job that waits for a pass can share one (vLLM's continuous batching, applied to verification
passes). The products, norms, embedding and head work row by row on the skinny kernel, so they
run over the concatenated rows of every job; attention is each job's own, against its own KV
cache. Where the forward is shape-invariant (the packed qwen2.5-coder models: a row's result never
depends on its pass), each job's logits are bit for bit those of its own ``extend``: exactness,
receipts and challenges are untouched (tests/test_batch_forward.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from node.model.kernels.llama import LeanLM
from node.model.kernels.rows import RowLayout


class BatchError(ValueError):
    """Jobs that cannot share a pass: other weights, a forward that is not shape-invariant, no tokens."""


def check_batch(
    jobs: Sequence[LeanLM], tokens: Sequence[Sequence[int]], trees: Sequence[Sequence[int] | None] | None = None
) -> list[RowLayout]:
    """Each job's rows' layout; BatchError (or ContextTooLong, TreeShapeError) unless these jobs'
    rows can share one pass. ``trees``: each job's rows' parents (None: a chain)."""
    trees = [None] * len(tokens) if trees is None else trees
    if not jobs or len(jobs) != len(tokens) or len(trees) != len(tokens):
        raise BatchError(f"{len(jobs)} jobs for {len(tokens)} token lists and {len(trees)} trees")
    for job in jobs:
        if not isinstance(job, LeanLM):
            raise BatchError(f"{getattr(job, 'name', job)}: only the lean forward's caches can share a pass")
    weights = jobs[0].weights
    for job, new in zip(jobs, tokens, strict=True):
        if job.weights is not weights:
            raise BatchError("jobs of one pass must share their weights (forks of one model)")
        if not job.shape_invariant:
            raise BatchError(f"{job.name}: its forward is not shape-invariant, so a shared pass would change its bits")
        if not new:
            raise BatchError("every job of a pass needs at least one token")
    if len({id(job) for job in jobs}) != len(jobs):
        raise BatchError("a job appears twice in one pass")
    return [job.layout(new, tree) for job, new, tree in zip(jobs, tokens, trees, strict=True)]


def extend_batch(
    jobs: Sequence[LeanLM], tokens: Sequence[Sequence[int]], trees: Sequence[Sequence[int] | None] | None = None
) -> list[np.ndarray]:
    """``[job.extend(new) for job, new in zip(jobs, tokens)]`` in one pass: each [len(new), V] float32.
    A job with parents in ``trees`` has its rows scored as a tree (``LeanLM.extend_tree``)."""
    trees = [None] * len(tokens) if trees is None else trees
    layouts = check_batch(jobs, tokens, trees)
    w = jobs[0].weights
    spans, begin = [], 0  # each job's rows in the pass
    for job, new, layout in zip(jobs, tokens, layouts, strict=True):
        job.reserve(layout.start + len(new))
        spans.append(slice(begin, begin + len(new)))
        begin += len(new)
    with torch.inference_mode():
        ids = torch.tensor([t for new in tokens for t in new], dtype=torch.long)
        logits = _forward(jobs, w, ids, spans, layouts)
    for job, new, tree in zip(jobs, tokens, trees, strict=True):
        job.record(new, tree)
    return [logits[rows].numpy() for rows in spans]


def _forward(jobs: Sequence[LeanLM], w, ids: torch.Tensor, spans: list[slice], layouts: list[RowLayout]):
    """LeanLM._forward over several jobs: shared products on all rows [ΣM, ·], attention per job."""
    hidden = w.embed(ids)  # [ΣM, d]
    tables = [layout.rotary(w) for layout in layouts]
    scratch = [torch.empty(layout.start + layout.rows) for layout in layouts]
    lead = jobs[0]
    for i, layer in enumerate(w.layers):
        qkv = lead.qkv(layer, layer.input_norm(hidden))  # [ΣM, q + 2 kv]
        attended = [
            job.attend(i, qkv[rows], cos, sin, layout, buf)
            for job, rows, layout, (cos, sin), buf in zip(jobs, spans, layouts, tables, scratch, strict=True)
        ]
        hidden = hidden + layer.o(torch.cat(attended))
        hidden = hidden + lead.mlp(layer, hidden)
    return w.head(w.norm(hidden)).float()
