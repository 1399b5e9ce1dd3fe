"""EAGLE-2 top-k tree: at each depth expand the k best nodes of that depth (by path score over the
parent-conditioned log-probabilities), each with its k best children, then keep the N best of all
generated nodes. k = 4 is the paper's comparison point ("an EAGLE-2-style top-4 tree", §6.4).
Ties as documented in ``base`` (score, then depth, then the candidate-index path).
"""

from __future__ import annotations

import numpy as np

from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, assemble_levels, empty_trees, select_columns

DEFAULT_TOP_K = 4


def build(batch: StepBatch, nodes: int, depth_cap: int | None = None, top_k: int = DEFAULT_TOP_K) -> DraftTrees:
    b, k = batch.size, batch.candidates
    width = min(top_k, k)
    depth = batch.positions if depth_cap is None else max(0, min(depth_cap, batch.positions))
    if nodes == 0 or depth == 0 or b == 0 or width == 0:
        return empty_trees(b, nodes)
    parent_rank = np.zeros((b, 1), dtype=np.int64)  # the root: any row of position 0 (all are equal)
    parent_score = np.zeros((b, 1), dtype=np.float32)
    parent_id = np.full((b, 1), -1, dtype=np.int64)
    levels, offset = [], 0
    for d in range(depth):
        p = parent_rank.shape[1]
        edge = batch.edge_logp(d, parent_rank)  # [B, P, K]
        child = select_columns(edge.reshape(-1, k), width).reshape(b, p, width)  # candidate order
        score = (parent_score[:, :, None] + np.take_along_axis(edge, child, axis=2)).reshape(b, p * width)
        levels.append(
            (
                np.repeat(np.arange(b), p * width),
                child.reshape(-1),
                score.reshape(-1),
                np.repeat(parent_id, width, axis=1).reshape(-1),
                d + 1,
            )
        )
        cols = select_columns(score, width)  # the depth's k best, in lexicographic order
        parent_rank = np.take_along_axis(child.reshape(b, -1), cols, axis=1)
        parent_score = np.take_along_axis(score, cols, axis=1)
        parent_id = offset + np.arange(b)[:, None] * (p * width) + cols
        offset += b * p * width
    return assemble_levels(levels, batch, nodes)
