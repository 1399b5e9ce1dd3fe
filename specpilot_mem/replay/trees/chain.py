"""Stock chain: the greedy argmax path of the parent-conditioned scores, one node per position.

Position 0 takes the best candidate given the committed token; each later position the best
candidate given the one chosen before (ties: lower candidate index). A chain of length
min(N, m, depth cap), so with N >= m it is stock's m-position draft.
"""

from __future__ import annotations

import numpy as np

from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, chain_trees


def build(batch: StepBatch, nodes: int, depth_cap: int | None = None) -> DraftTrees:
    length = min(nodes, batch.positions, batch.positions if depth_cap is None else depth_cap)
    rows = np.arange(batch.size)
    ranks = np.zeros((batch.size, length), dtype=np.int64)
    scores = np.zeros((batch.size, length), dtype=np.float32)
    parent = np.zeros(batch.size, dtype=np.int64)
    total = np.zeros(batch.size, dtype=np.float32)
    for d in range(length):
        row = batch.edge_logp(d, parent[:, None])[:, 0]  # [B, K]
        parent = np.argmax(row, axis=1)
        total = total + row[rows, parent]
        ranks[:, d], scores[:, d] = parent, total
    lengths = np.full(batch.size, length, dtype=np.int64)
    if length:  # a chain stops before a position with no usable candidate
        lengths = np.where(np.isfinite(scores).all(axis=1), length, np.argmin(np.isfinite(scores), axis=1))
    return chain_trees(ranks, scores, batch, lengths, nodes)
