"""The oracle (§3.1): keeps accepting the target's greedy token while it is among the position's
top-K candidates. Its tree is that chain (at most min(N, m, depth cap) nodes), so at every step no
builder with the same budget and depth cap accepts more.
"""

from __future__ import annotations

import numpy as np

from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, TreeError, chain_trees


def build(batch: StepBatch, nodes: int, depth_cap: int | None = None) -> DraftTrees:
    if batch.greedy is None:
        raise TreeError(
            "the oracle needs the target's greedy tokens",
            where="StepBatch.greedy",
            fix="build the batch with StepBatch.from_lattice(..., with_greedy=True)",
        )
    length = min(nodes, batch.positions, batch.positions if depth_cap is None else depth_cap)
    hit = batch.cand[:, :length, :] == batch.greedy[:, :length, None]  # [B, L, K]
    present = hit.any(axis=2)
    ranks = np.argmax(hit, axis=2)
    run = np.cumprod(present, axis=1).sum(axis=1) if length else np.zeros(batch.size, dtype=np.int64)
    prev = np.concatenate([np.zeros((batch.size, 1), np.int64), ranks[:, :-1]], axis=1)
    edge = np.zeros((batch.size, length), dtype=np.float32)
    for d in range(length):
        edge[:, d] = np.take_along_axis(batch.edge_logp(d, prev[:, d : d + 1])[:, 0], ranks[:, d : d + 1], axis=1)[:, 0]
    return chain_trees(ranks, np.cumsum(edge, axis=1, dtype=np.float32), batch, run, nodes)
