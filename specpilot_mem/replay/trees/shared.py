"""A node budget shared by a batch of requests (§4.4): each step verifies the N best nodes by path
score over all requests in flight. Each request's best-first order is prefix-closed, so its share
(the nodes of its own order that made the global cut) is a prefix of that order: a valid tree.

Ties across requests: higher score, then the request's place in its group, then its node order.
"""

from __future__ import annotations

import numpy as np

from specpilot_mem.replay.trees import best_first
from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, select_top


def shares(trees: DraftTrees, groups: np.ndarray, nodes: int) -> np.ndarray:
    """[B] nodes per request: the global top-``nodes`` of each group's union of best-first trees.

    trees: best-first trees of B requests (each with at least its own top ``nodes``); groups [B]:
    which requests share a budget (same id = same step of one server).
    """
    b = trees.parents.shape[0]
    groups = np.asarray(groups)
    order = np.argsort(groups, kind="stable")
    gid, start, size = np.unique(groups[order], return_index=True, return_counts=True)
    width = int(size.max(initial=0))
    member = np.arange(b) - np.repeat(start, size)  # place inside its group, in step order
    row = np.repeat(np.arange(gid.shape[0]), size)
    n = trees.parents.shape[1]
    pool = np.full((gid.shape[0], width * n), -np.inf, dtype=np.float32)
    cols = member[:, None] * n + np.arange(n)[None, :]
    pool[row[:, None], cols] = trees.scores[order]
    take = min(nodes, pool.shape[1])
    chosen = select_top(pool, take)
    chosen_score = np.take_along_axis(pool, chosen, axis=1)
    counted = np.zeros((gid.shape[0], width), dtype=np.int64)
    owner = chosen // n
    np.add.at(
        counted,
        (np.repeat(np.arange(gid.shape[0]), take), owner.reshape(-1)),
        (chosen_score > -np.inf).reshape(-1).astype(np.int64),
    )
    out = np.empty(b, dtype=np.int64)
    out[order] = counted[row, member]
    return out


def build(batch: StepBatch, groups: np.ndarray, nodes: int, depth_cap: int | None = None) -> DraftTrees:
    """Best-first trees whose node counts add up to at most ``nodes`` per group (padded to ``nodes``)."""
    own = best_first.build(batch, nodes, depth_cap)
    return own.truncate(shares(own, groups, nodes))
