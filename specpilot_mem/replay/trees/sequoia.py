"""Sequoia: one fixed tree shape for every step, chosen by dynamic programming over the acceptance
probability of each child rank.

``acceptance[r]`` is the probability that the target's token is the r-th best child (by the
parent-conditioned score) of an accepted node. The shape maximises the expected number of accepted
nodes, Σ over nodes of Π acceptance[rank] along the root path, for N nodes and the depth cap.
At each step the shape is filled with tokens: a node of rank r holds the r-th best candidate of its
position given its parent's candidate. ``fit_acceptance`` estimates the vector from lattices
(in-sample when replaying the same lattices, as Sequoia fits it on its own traces).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, TreeError, empty_trees, pad_trees, select_top

FIT_STEPS = 20_000  # steps sampled to estimate the vector; enough for 3 decimals of the top ranks


def fit_acceptance(lattices, max_steps: int = FIT_STEPS, seed: int = 0) -> np.ndarray:
    """[K] float64: P(the greedy token is the r-th best child | its parent was accepted)."""
    hits, alive_total = None, 0
    rng = np.random.default_rng(seed)
    for lat in lattices:
        steps = np.arange(lat.num_steps)
        if steps.size > max_steps:
            steps = np.sort(rng.choice(steps, max_steps, replace=False))
        batch = StepBatch.from_lattice(lat, steps)
        ranks = true_ranks(batch)  # [B, m], K = miss
        alive = np.concatenate([np.ones((batch.size, 1), bool), ranks[:, :-1] < batch.candidates], axis=1)
        counts = np.bincount(ranks[alive], minlength=batch.candidates + 1)[: batch.candidates]
        hits = counts if hits is None else hits + counts
        alive_total += int(alive.sum())
    if not alive_total:
        raise TreeError(
            "no lattice steps to fit Sequoia's acceptance vector", where="LATTICES", fix="pass lattices that hold steps"
        )
    return hits / alive_total


def true_ranks(batch: StepBatch) -> np.ndarray:
    """[B, m] int64: rank of the greedy token among position d's candidates given the greedy token at
    d-1 (ties by candidate index); K when it is not a candidate (or its parent is not)."""
    k = batch.candidates
    hit = batch.cand == batch.greedy[:, :, None]
    index = np.where(hit.any(axis=2), np.argmax(hit, axis=2), -1)  # [B, m] candidate index or -1
    parent = np.concatenate([np.zeros((batch.size, 1), np.int64), index[:, :-1]], axis=1)
    rows = np.arange(batch.size)[:, None]
    depth = np.arange(batch.positions)[None, :]
    row = batch.conditional_logp[rows, depth, np.maximum(parent, 0)]  # [B, m, K]
    mine = np.take_along_axis(row, np.maximum(index, 0)[:, :, None], axis=2)
    better = (row > mine) | ((row == mine) & (np.arange(k) < np.maximum(index, 0)[:, :, None]))
    rank = better.sum(axis=2)
    return np.where((index >= 0) & (parent >= 0), rank, k)


@lru_cache(maxsize=64)
def tree_shape(
    acceptance: tuple[float, ...], nodes: int, depth: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(parents, child ranks, depths) of the expected-acceptance-maximising shape, parents first.

    best[D][n]: max expected accepted nodes below an accepted node with at most n nodes and depth D.
    sub[D][r][n]: the same using only child ranks >= r; a child of rank r with a subtree of s nodes
    adds acceptance[r] * (1 + best[D-1][s-1]).
    """
    k = len(acceptance)
    p = np.asarray(acceptance, dtype=np.float64)
    best = np.zeros((depth + 1, nodes + 1))
    choice = np.zeros((depth + 1, k + 1, nodes + 1), dtype=np.int64)  # subtree size given to rank r
    sub = np.zeros((depth + 1, k + 1, nodes + 1))
    n = np.arange(nodes + 1)
    for dd in range(1, depth + 1):
        for r in range(k - 1, -1, -1):
            # value[n, s] = p[r] * (1 + best[dd-1][s-1]) + sub[dd][r+1][n-s] for 1 <= s <= n; s = 0: skip rank r (and later)
            s = n[None, :]
            rest = n[:, None] - s
            gain = np.where(s >= 1, p[r] * (1.0 + best[dd - 1][np.maximum(s - 1, 0)]), 0.0)
            value = np.where(rest >= 0, gain + sub[dd][r + 1][np.maximum(rest, 0)], -np.inf)
            value[:, 0] = 0.0  # rank r unused: then no later rank either (ranks form a prefix)
            pick = np.argmax(value, axis=1)
            sub[dd][r], choice[dd][r] = value[n, pick], pick
        best[dd] = sub[dd][0]
    parents: list[int] = []
    ranks: list[int] = []
    depths: list[int] = []

    def grow(parent: int, budget: int, dd: int, level: int) -> None:
        r = 0
        while budget > 0 and r < k and dd > 0:
            size = int(choice[dd][r][budget])
            if size == 0:
                return
            parents.append(parent)
            ranks.append(r)
            depths.append(level)
            grow(len(parents) - 1, size - 1, dd - 1, level + 1)
            budget -= size
            r += 1

    grow(-1, nodes, depth, 1)
    return tuple(parents), tuple(ranks), tuple(depths)


def build(batch: StepBatch, nodes: int, depth_cap: int | None = None, acceptance=None) -> DraftTrees:
    if acceptance is None:
        raise TreeError(
            "Sequoia needs the acceptance probability of each child rank",
            where="sequoia.build",
            fix="pass acceptance=fit_acceptance(lattices) (replay does this for you)",
        )
    depth = min(batch.positions, batch.positions if depth_cap is None else depth_cap)
    parents, child_rank, depths = (
        np.asarray(x, dtype=np.int64) for x in tree_shape(tuple(float(a) for a in acceptance), nodes, depth)
    )
    b, n = batch.size, parents.shape[0]
    if n == 0:
        return empty_trees(b, nodes)
    logp = batch.conditional_logp
    rows = np.arange(b)
    cand_index = np.zeros((b, n), dtype=np.int64)
    scores = np.zeros((b, n), dtype=np.float32)
    order_cache: dict[int, np.ndarray] = {}
    for i in range(n):
        parent_index = cand_index[:, parents[i]] if parents[i] >= 0 else np.zeros(b, np.int64)
        d = int(depths[i]) - 1
        row = logp[rows, d, parent_index]  # [B, K]
        order = order_cache.get(int(parents[i]))
        if order is None:  # siblings share their parent's ranking
            order = select_top(row, batch.candidates)  # best first, ties by candidate index
            order_cache[int(parents[i])] = order
        cand_index[:, i] = order[:, child_rank[i]]
        scores[:, i] = (scores[:, parents[i]] if parents[i] >= 0 else 0.0) + row[rows, cand_index[:, i]]
    valid = np.isfinite(scores)
    for i in range(n):  # a node under an unusable candidate is dropped with its subtree
        if parents[i] >= 0:
            valid[:, i] &= valid[:, parents[i]]
    # keep the fixed shape's order; invalid nodes become padding at the end
    order = np.argsort(~valid, axis=1, kind="stable")
    keep = np.take_along_axis(valid, order, axis=1)
    old_to_new = np.empty_like(order)
    np.put_along_axis(old_to_new, order, np.arange(n)[None, :].repeat(b, 0), axis=1)
    par = parents[order]
    new_par = np.where(par >= 0, np.take_along_axis(old_to_new, np.maximum(par, 0), axis=1), -1)
    tokens = batch.tokens(rows[:, None], depths[order] - 1, np.take_along_axis(cand_index, order, axis=1))
    return pad_trees(
        DraftTrees(
            parents=np.where(keep, new_par, -1),
            depths=np.where(keep, depths[order], 0),
            ranks=np.where(keep, np.take_along_axis(cand_index, order, axis=1), -1),
            tokens=np.where(keep, tokens, -1).astype(np.int64),
            scores=np.where(keep, np.take_along_axis(scores, order, axis=1), -np.inf).astype(np.float32),
            num_nodes=keep.sum(axis=1).astype(np.int64),
        ),
        nodes,
    )
