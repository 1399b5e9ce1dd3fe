"""What every builder shares: the batch of lattice steps it reads, the batch of trees it returns, and
the batched best-first search over path scores.

Conventions (``docs/lattice-format.md`` has the full text):

* A tree's nodes exclude the root (the committed token); node ``i`` has depth ``depths[i] >= 1`` and
  holds candidate ``ranks[i]`` of drafted position ``depths[i] - 1``; ``parents[i] < i`` (-1: the root).
  Nodes are in best-first order where a builder has one, so every prefix is itself a valid tree.
* Path score = float32 sum, root to node, of per-edge log-probabilities.
* Tie-break (documented, deterministic): higher path score first; then shallower; then the
  candidate-index path in lexicographic order (lower candidate index first).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.replay.lattice import conditional

_INDEX_BITS = 20  # low bits of a selection key: the tie-break
_INDEX_MASK = (1 << _INDEX_BITS) - 1


class TreeError(SpecPilotError):
    """A builder asked for something the lattice or the budget cannot give."""


def log_softmax(x: np.ndarray) -> np.ndarray:
    """float32 log_softmax over the last axis (contiguous rows reduce the same way whatever the
    array's shape, so a row gathered alone and the same row in a full lattice give identical bits).
    Results are <= 0 exactly (x - max <= 0 and log(sum) >= 0); a row with no finite score is -inf."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    top = np.max(x, axis=-1, keepdims=True)
    top[~np.isfinite(top)] = 0.0
    shifted = x - top
    total = np.exp(shifted).sum(axis=-1, keepdims=True)
    np.maximum(total, np.float32(1.0), out=total)  # >= 1 whenever a score is finite; all -inf rows: log 1 = 0
    shifted -= np.log(total)
    return shifted


@dataclass
class StepBatch:
    """B lattice steps for the builders, read in place from [S, ...] arrays (no per-batch copy of the
    K x K scores: builders gather only the rows they expand).

    source_cand [S, m, K] int; source_unary [S, m, K]; source_pair [S, m, K, K] (float16 or float32;
    pair[s, d, i, j] scores candidate j at position d given candidate i at d-1, rows of d = 0 equal);
    steps [B] indices into them; kind: "selector" (score = pair) or "markov" (score = unary + pair);
    greedy [B, m] int64 (optional): the target's greedy tokens from each step's position on, -1 past
    the end (read only by the oracle and Sequoia's fit).
    """

    source_cand: np.ndarray
    source_unary: np.ndarray
    source_pair: np.ndarray
    steps: np.ndarray
    kind: str = "selector"
    greedy: np.ndarray | None = None

    @classmethod
    def from_lattice(cls, lat, steps: np.ndarray, with_greedy: bool = True) -> "StepBatch":
        steps = np.asarray(steps, dtype=np.int64)
        greedy = None
        if with_greedy:
            greedy = lat.greedy_windows(
                lat.step_request[steps].astype(np.int64), lat.step_position[steps].astype(np.int64), lat.positions
            )
        return cls(lat.cand, lat.unary, lat.pair, steps, lat.kind, greedy)

    @classmethod
    def from_scores(cls, cand, unary, pair, kind: str = "selector", greedy=None) -> "StepBatch":
        """From an engine's tensors (numpy or torch): cand [B,m,K], unary [B,m,K], pair [B,m,K,K]."""

        def to_np(t, dtype=None):
            if hasattr(t, "detach"):
                t = t.detach().cpu()
                t = t.float() if t.is_floating_point() else t
                t = t.numpy()
            return np.asarray(t, dtype=dtype)

        cand_np = to_np(cand, np.int64)
        greedy_np = None if greedy is None else to_np(greedy, np.int64)
        return cls(
            cand_np, to_np(unary, np.float32), to_np(pair, np.float32), np.arange(cand_np.shape[0]), kind, greedy_np
        )

    @property
    def size(self) -> int:
        return int(self.steps.shape[0])

    @property
    def positions(self) -> int:
        return int(self.source_cand.shape[1])

    @property
    def candidates(self) -> int:
        return int(self.source_cand.shape[2])

    @cached_property
    def cand(self) -> np.ndarray:
        """[B, m, K] candidate tokens."""
        return self.source_cand[self.steps]

    def tokens(self, rows: np.ndarray, position: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Candidate tokens at (batch row, drafted position, candidate index), any broadcastable shape."""
        return self.source_cand[self.steps[rows], position, rank].astype(np.int64)

    def edge_logp(self, d: int, parent_rank: np.ndarray) -> np.ndarray:
        """[B, P, K] float32: log_softmax over position d's candidates given each parent's candidate
        (parent_rank [B, P], candidate indices at d-1; any value at d = 0). The paper's edge score."""
        b, p = parent_rank.shape
        rows = np.broadcast_to(np.arange(b)[:, None], (b, p)).reshape(-1)
        return self.edge_logp_flat(d, rows, parent_rank.reshape(-1)).reshape(b, p, -1)

    def edge_logp_flat(self, d: int, rows: np.ndarray, parent_rank: np.ndarray) -> np.ndarray:
        """[L, K]: ``edge_logp`` for L (batch row, parent candidate) pairs.

        A row depends only on (step, position, parent candidate), and a search reaches the same
        parent candidate along many paths, so each row is computed once per batch: a per-position
        table maps (row, candidate) to its slot in a store of computed rows. (Gathers use
        ``np.take``, several times faster than fancy indexing here.)"""
        k, m = self.candidates, self.positions
        table, store, used = self._rows.get(d) or (
            np.full(self.size * k, -1, dtype=np.int64),
            np.empty((self.size * k, k), dtype=np.float32),
            0,
        )
        key = rows * k + parent_rank
        missing = key[table.take(key) < 0]
        if missing.size:
            slot = np.arange(missing.size)
            table[missing] = slot  # duplicates: the last write wins, once per key
            fresh = missing[table.take(missing) == slot]
            step = self.steps.take(fresh // k)
            pair = self._pair_rows.take((step * m + d) * k + fresh % k, axis=0)
            unary = self._unary_rows.take(step * m + d, axis=0)
            store[used : used + fresh.size] = log_softmax(conditional(self.kind, pair, unary))
            table[fresh] = used + np.arange(fresh.size)
            used += fresh.size
        self._rows[d] = (table, store, used)
        return store.take(table.take(key), axis=0)

    @cached_property
    def _pair_rows(self) -> np.ndarray:
        """source_pair as [S * m * K, K] rows (a view)."""
        return np.ascontiguousarray(self.source_pair).reshape(-1, self.candidates)

    @cached_property
    def _unary_rows(self) -> np.ndarray:
        """source_unary as [S * m, K] rows (a view)."""
        return np.ascontiguousarray(self.source_unary).reshape(-1, self.candidates)

    @cached_property
    def _rows(self) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
        return {}

    def marginal_edge_logp(self, d: int) -> np.ndarray:
        """[B, 1, K] float32: log_softmax of position d's unary scores (DDTree's per-depth marginals)."""
        return self.marginal_logp[:, d]

    @cached_property
    def conditional_logp(self) -> np.ndarray:
        """[B, m, K, K]: ``edge_logp`` for every position and parent (bit-identical to it)."""
        every = np.broadcast_to(np.arange(self.candidates), (self.size, self.candidates))
        return np.stack([self.edge_logp(d, every) for d in range(self.positions)], axis=1)

    @cached_property
    def marginal_logp(self) -> np.ndarray:
        """[B, m, 1, K]: log_softmax of each position's unary scores."""
        return log_softmax(self.source_unary[self.steps])[:, :, None, :]


@dataclass
class DraftTrees:
    """A batch of B trees padded to N nodes; node i of tree b is valid when i < num_nodes[b].

    parents [B, N] int64 (-1: child of the root; parent < node); depths [B, N] int64 (>= 1; 0 pads);
    ranks [B, N] int64 (candidate index at position depth-1; -1 pads); tokens [B, N] int64 (-1 pads);
    scores [B, N] float32 (path scores; -inf pads); num_nodes [B] int64.
    """

    parents: np.ndarray
    depths: np.ndarray
    ranks: np.ndarray
    tokens: np.ndarray
    scores: np.ndarray
    num_nodes: np.ndarray

    @property
    def valid(self) -> np.ndarray:
        return np.arange(self.parents.shape[1])[None, :] < self.num_nodes[:, None]

    def truncate(self, num_nodes: np.ndarray) -> "DraftTrees":
        """Keep the first ``num_nodes[b]`` nodes of each tree (valid for best-first order)."""
        keep = np.minimum(np.asarray(num_nodes, dtype=np.int64), self.num_nodes)
        mask = np.arange(self.parents.shape[1])[None, :] < keep[:, None]
        return DraftTrees(
            np.where(mask, self.parents, -1),
            np.where(mask, self.depths, 0),
            np.where(mask, self.ranks, -1),
            np.where(mask, self.tokens, -1),
            np.where(mask, self.scores, -np.inf).astype(np.float32),
            keep,
        )

    def tree(self, b: int) -> dict[str, np.ndarray]:
        n = int(self.num_nodes[b])
        return {
            "parents": self.parents[b, :n],
            "depths": self.depths[b, :n],
            "ranks": self.ranks[b, :n],
            "tokens": self.tokens[b, :n],
            "scores": self.scores[b, :n],
        }


def ancestor_mask(trees: DraftTrees) -> np.ndarray:
    """[B, N, N] bool: mask[b, i, j] is true when node j is node i or one of its ancestors.

    With the root (always visible) this is the tree-attention mask of the verify pass; padding rows
    see only themselves.
    """
    b, n = trees.parents.shape
    mask = np.broadcast_to(np.eye(n, dtype=bool), (b, n, n)).copy()
    rows = np.arange(b)
    for i in range(n):  # parents precede children, so each parent's row is final when read
        parent = trees.parents[:, i]
        has = (parent >= 0) & trees.valid[:, i]
        mask[rows[has], i] |= mask[rows[has], parent[has]]
    return mask


def verify_mask(trees: DraftTrees) -> np.ndarray:
    """[B, N+1, N+1] bool attention mask with the root as row/column 0 (every valid node sees it)."""
    b, n = trees.parents.shape
    full = np.zeros((b, n + 1, n + 1), dtype=bool)
    full[:, 0, 0] = True
    full[:, 1:, 1:] = ancestor_mask(trees)
    full[:, 1:, 0] = trees.valid
    return full


def descending_keys(scores: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """int64 keys that sort ascending as (float32 score descending, ``tie`` ascending); tie < 2**20.

    A float's bits, with the non-sign bits of negative values flipped, sort like the float; score and
    tie then form one unique key, so sorts are exact under ties.
    """
    s = (np.asarray(scores, dtype=np.float32) + np.float32(0.0)).view(np.int32)  # +0.0 folds -0.0 into +0.0
    ascending = np.where(s >= 0, s, s ^ np.int32(0x7FFFFFFF)).astype(np.int64)
    return ((-ascending) << _INDEX_BITS) | tie


def select_columns(scores: np.ndarray, count: int) -> np.ndarray:
    """[B, count] columns of the ``count`` best entries per row, in column order. Best = higher
    score, then lower column (exact under ties). One float partition finds each row's cut value;
    ties at the cut go to the lowest columns."""
    b, width = scores.shape
    if count >= width:
        return np.broadcast_to(np.arange(width), (b, width))
    if count == 0:
        return np.zeros((b, 0), dtype=np.int64)
    cut = np.partition(scores, width - count, axis=1)[:, width - count, None]  # the count-th largest
    above = scores > cut
    at = scores == cut
    need = count - above.sum(axis=1, keepdims=True)
    tied = np.flatnonzero(at.sum(axis=1, keepdims=True) != need)  # rows with more entries at the cut
    if tied.size:
        at[tied] &= np.cumsum(at[tied], axis=1) <= need[tied]
    return np.nonzero(above | at)[1].reshape(b, count)


def select_top(scores: np.ndarray, count: int) -> np.ndarray:
    """[B, count] columns of the ``count`` best entries per row, best first: higher score, then lower
    column (exact under ties)."""
    if scores.shape[1] > _INDEX_MASK + 1:
        raise TreeError(
            f"selection over {scores.shape[1]} entries is too large",
            where="replay.trees",
            fix="use a smaller node budget or depth cap",
        )
    cols = select_columns(scores, min(count, scores.shape[1]))
    keys = descending_keys(np.take_along_axis(scores, cols, axis=1), cols)
    return np.sort(keys, axis=1) & _INDEX_MASK


BOUND_BEAM = 2  # paths followed to find a lower bound of the N-th best path score


def score_bound(batch: StepBatch, nodes: int, depth: int, marginal: bool = False) -> np.ndarray:
    """[B] float32 lower bound of the N-th best path score: the N-th best of the nodes a beam of
    ``BOUND_BEAM`` paths generates (all children of each beam node). Any N distinct nodes give
    such a bound; following the best paths makes it tight."""
    b, k = batch.size, batch.candidates
    rows = np.arange(b)
    parent_rank = np.zeros((b, 1), dtype=np.int64)
    parent_score = np.zeros((b, 1), dtype=np.float32)
    seen = []
    for d in range(depth):
        width = parent_rank.shape[1]
        if marginal:
            edge = batch.marginal_edge_logp(d)
        else:
            edge = batch.edge_logp_flat(d, np.repeat(rows, width), parent_rank.reshape(-1)).reshape(b, width, k)
        score = (parent_score[:, :, None] + edge).reshape(b, width * k)
        seen.append(score)
        top, parent_score = _best_columns(score, min(BOUND_BEAM, score.shape[1]))
        parent_rank = top % k
    generated = np.concatenate(seen, axis=1)
    if generated.shape[1] < nodes:
        return np.full(b, -np.inf, dtype=np.float32)
    generated.partition(generated.shape[1] - nodes, axis=1)  # in place: no copy of the pool
    return generated[:, generated.shape[1] - nodes]


def _best_columns(score: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Columns and scores of ``count`` best entries per row, ties in any order (repeated argmax:
    cheaper than a partition for a beam of 2). A pick past a row's finite entries scores -inf, so
    a column picked twice never counts twice."""
    base = np.arange(score.shape[0]) * score.shape[1]
    work = score.copy()
    cols = np.empty((score.shape[0], count), dtype=np.int64)
    values = np.empty((score.shape[0], count), dtype=np.float32)
    for i in range(count):
        cols[:, i] = np.argmax(work, axis=1)
        flat = base + cols[:, i]
        values[:, i] = work.take(flat)
        np.put(work, flat, -np.inf)
    return cols, values


def best_first_search(batch: StepBatch, nodes: int, depth_cap: int | None, marginal: bool = False) -> DraftTrees:
    """The exact top-``nodes`` nodes by path score (the best-first tree), for a batch of steps.

    Works on flat lists of (step, node) pairs, depth by depth, expanding only nodes at or above a
    lower bound of the N-th best path score (``score_bound``): a node below it has N better nodes,
    and so do its descendants (edges are log-probabilities <= 0). A depth that still keeps more
    than N nodes of one step keeps its top N (a node of the global top-N is in the top N of its
    depth). The survivors hold the global top-N; one selection gives it, in best-first order.
    Ties: lists stay in (step, lexicographic) order inside a depth and pools are concatenated by
    depth, so the selection's column tie-break is the documented order.
    """
    b, k = batch.size, batch.candidates
    depth = batch.positions if depth_cap is None else max(0, min(depth_cap, batch.positions))
    if nodes == 0 or depth == 0 or b == 0:
        return empty_trees(b, nodes)
    bound = score_bound(batch, nodes, depth, marginal)
    row = np.arange(b)
    rank = np.zeros(b, dtype=np.int64)
    score = np.zeros(b, dtype=np.float32)
    ident = np.full(b, -1, dtype=np.int64)  # pool id of each parent (-1: the root)
    levels = []
    offset = 0
    for d in range(depth):
        if row.size == 0:
            break
        if marginal:
            edge = batch.marginal_edge_logp(d)[:, 0][row]
        else:
            edge = batch.edge_logp_flat(d, row, rank)
        child_score = score[:, None] + edge  # [L, K] float32 sum, root to node
        flat = np.flatnonzero(child_score >= bound.take(row)[:, None])
        li = flat // k
        row, rank, score, parent = row.take(li), flat % k, child_score.take(flat), ident.take(li)
        counts = np.bincount(row, minlength=b)
        if counts.max(initial=0) > nodes:  # keep each step's top N of this depth
            keep = _top_per_row(row, score, counts, nodes)
            row, rank, score, parent = row[keep], rank[keep], score[keep], parent[keep]
        levels.append((row, rank, score, parent, d + 1))
        ident = offset + np.arange(row.size)
        offset += row.size
    return assemble_levels(levels, batch, nodes)


def _top_per_row(row: np.ndarray, score: np.ndarray, counts: np.ndarray, nodes: int) -> np.ndarray:
    """Mask of each row's ``nodes`` best entries (flat lists grouped by row, in tie-break order)."""
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    over = np.flatnonzero(counts > nodes)
    mine = np.isin(row, over)
    index = np.flatnonzero(mine)
    r = row[index]
    slot = np.searchsorted(over, r)
    col = index - start[r]
    dense = np.full((over.size, int(counts[over].max())), -np.inf, dtype=np.float32)
    dense[slot, col] = score[index]
    chosen = np.zeros(dense.shape, dtype=bool)
    np.put_along_axis(chosen, select_columns(dense, nodes), True, axis=1)
    keep = ~mine
    keep[index] = chosen[slot, col]
    return keep


def assemble_levels(levels, batch: StepBatch, nodes: int) -> DraftTrees:
    """The top-``nodes`` of all levels' nodes, in best-first order, as a ``DraftTrees`` batch.

    levels: per depth, flat arrays (batch row, candidate index, path score, parent id) in (row,
    lexicographic) order, and the depth; a node's id is its index in the concatenation of all levels
    (parent -1: the root)."""
    b = batch.size
    row = np.concatenate([lv[0] for lv in levels])
    rank = np.concatenate([lv[1] for lv in levels])
    score = np.concatenate([lv[2] for lv in levels])
    parent = np.concatenate([lv[3] for lv in levels])
    depth = np.concatenate([np.full(lv[0].size, lv[4], dtype=np.int64) for lv in levels])
    order = np.argsort(row, kind="stable")  # (step, depth, lexicographic)
    counts = np.bincount(row, minlength=b)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    width = int(counts.max(initial=0))
    if width == 0:
        return empty_trees(b, nodes)
    sorted_row = row.take(order)
    dense = np.full((b, width), -np.inf, dtype=np.float32)
    np.put(dense, sorted_row * width + np.arange(row.size) - start.take(sorted_row), score.take(order))
    n = min(nodes, width)
    sel = select_top(dense, n)  # [B, n] best first
    rows = np.arange(b)[:, None]
    present = sel < counts[:, None]
    ids = order.take(np.minimum(start[:, None] + sel, row.size - 1))
    sel_score = np.where(present, dense.take(rows * width + sel), -np.inf)
    valid = present & (sel_score > -np.inf)
    position = np.full(row.size, -1, dtype=np.int64)
    position[ids[valid]] = np.broadcast_to(np.arange(n), (b, n))[valid]
    par = parent.take(ids)
    parents = np.where(valid & (par >= 0), position.take(np.maximum(par, 0)), -1)
    sel_depth = np.where(valid, depth.take(ids), 0)
    sel_rank = np.where(valid, rank.take(ids), -1)
    tokens = np.where(valid, batch.tokens(rows, np.maximum(sel_depth - 1, 0), np.maximum(sel_rank, 0)), -1)
    trees = DraftTrees(
        parents,
        sel_depth,
        sel_rank,
        tokens.astype(np.int64),
        np.where(valid, sel_score, -np.inf).astype(np.float32),
        valid.sum(axis=1).astype(np.int64),
    )
    return pad_trees(trees, nodes)


def empty_trees(b: int, nodes: int) -> DraftTrees:
    return DraftTrees(
        np.full((b, nodes), -1, np.int64),
        np.zeros((b, nodes), np.int64),
        np.full((b, nodes), -1, np.int64),
        np.full((b, nodes), -1, np.int64),
        np.full((b, nodes), -np.inf, np.float32),
        np.zeros(b, np.int64),
    )


def pad_trees(trees: DraftTrees, nodes: int) -> DraftTrees:
    """Pad to exactly ``nodes`` columns so every builder returns [B, N] arrays."""
    extra = nodes - trees.parents.shape[1]
    if extra <= 0:
        return trees
    pad = lambda a, v: np.concatenate([a, np.full((a.shape[0], extra), v, dtype=a.dtype)], axis=1)  # noqa: E731
    return DraftTrees(
        pad(trees.parents, -1),
        pad(trees.depths, 0),
        pad(trees.ranks, -1),
        pad(trees.tokens, -1),
        pad(trees.scores, -np.inf),
        trees.num_nodes,
    )


def chain_trees(ranks: np.ndarray, scores: np.ndarray, batch: StepBatch, lengths: np.ndarray, nodes: int) -> DraftTrees:
    """Chains as trees: ranks/scores [B, L] along the chain, lengths [B] nodes kept, padded to ``nodes``."""
    b, length = ranks.shape
    idx = np.arange(length)[None, :]
    valid = idx < lengths[:, None]
    rows = np.arange(b)[:, None]
    depth = np.broadcast_to(idx + 1, (b, length))
    tokens = batch.tokens(rows, np.minimum(depth - 1, batch.positions - 1), np.maximum(ranks, 0)) if length else ranks
    trees = DraftTrees(
        np.where(valid, idx - 1, -1),
        np.where(valid, depth, 0),
        np.where(valid, ranks, -1),
        np.where(valid, tokens, -1).astype(np.int64),
        np.where(valid, scores, -np.inf).astype(np.float32),
        lengths.astype(np.int64),
    )
    return pad_trees(trees, nodes)
