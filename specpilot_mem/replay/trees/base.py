"""What every builder shares: the batch of lattice steps it reads, the batch of trees it returns, and
the batched top-N search over path scores.

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

_INDEX_BITS = 20  # room for 2^20 pool entries per row in a selection key


class TreeError(SpecPilotError):
    """A builder asked for something the lattice or the budget cannot give."""


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = x - top
    with np.errstate(divide="ignore", invalid="ignore"):
        out = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return np.where(np.isnan(out), -np.inf, out).astype(np.float32)  # a row with no candidate: all -inf


@dataclass
class StepBatch:
    """B lattice steps for the builders.

    cand [B, m, K] int: candidate tokens; cond [B, m, K, K] float32: score of candidate j at position d
    given candidate i at d-1 (rows of d = 0 are identical: the committed token is the only parent);
    unary [B, m, K] float32; greedy [B, m] int64 (optional): the target's greedy tokens from the step's
    position on, -1 past the end (only the oracle and Sequoia's fit read it).
    """

    cand: np.ndarray
    cond: np.ndarray
    unary: np.ndarray
    greedy: np.ndarray | None = None

    @classmethod
    def from_lattice(cls, lat, steps: np.ndarray, with_greedy: bool = True) -> "StepBatch":
        steps = np.asarray(steps, dtype=np.int64)
        greedy = None
        if with_greedy:
            greedy = lat.greedy_windows(lat.step_request[steps].astype(np.int64),
                                        lat.step_position[steps].astype(np.int64), lat.positions)
        return cls(cand=lat.cand[steps], cond=lat.conditional_scores(steps),
                   unary=lat.unary[steps].astype(np.float32), greedy=greedy)

    @classmethod
    def from_scores(cls, cand, unary, pair, kind: str = "selector", greedy=None) -> "StepBatch":
        """From an engine's tensors (numpy or torch): cand [B,m,K], unary [B,m,K], pair [B,m,K,K]."""
        to_np = lambda t: t.detach().float().cpu().numpy() if hasattr(t, "detach") else np.asarray(t, dtype=np.float32)  # noqa: E731
        unary_np = to_np(unary)
        cond = to_np(pair) + (unary_np[:, :, None, :] if kind == "markov" else 0.0)
        cand_np = cand.detach().cpu().numpy() if hasattr(cand, "detach") else np.asarray(cand)
        return cls(cand=cand_np, cond=cond.astype(np.float32), unary=unary_np, greedy=greedy)

    @property
    def size(self) -> int:
        return int(self.cand.shape[0])

    @property
    def positions(self) -> int:
        return int(self.cand.shape[1])

    @property
    def candidates(self) -> int:
        return int(self.cand.shape[2])

    @cached_property
    def conditional_logp(self) -> np.ndarray:
        """[B, m, K, K]: log_softmax over the K children of each parent (the paper's edge score)."""
        return log_softmax(self.cond, axis=-1)

    @cached_property
    def marginal_logp(self) -> np.ndarray:
        """[B, m, 1, K]: log_softmax of the unary scores per position (DDTree's per-depth marginals)."""
        return log_softmax(self.unary, axis=-1)[:, :, None, :]

    def subset(self, index: np.ndarray) -> "StepBatch":
        return StepBatch(self.cand[index], self.cond[index], self.unary[index],
                         None if self.greedy is None else self.greedy[index])


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
        return DraftTrees(np.where(mask, self.parents, -1), np.where(mask, self.depths, 0),
                          np.where(mask, self.ranks, -1), np.where(mask, self.tokens, -1),
                          np.where(mask, self.scores, -np.inf).astype(np.float32), keep)

    def tree(self, b: int) -> dict[str, np.ndarray]:
        n = int(self.num_nodes[b])
        return {"parents": self.parents[b, :n], "depths": self.depths[b, :n], "ranks": self.ranks[b, :n],
                "tokens": self.tokens[b, :n], "scores": self.scores[b, :n]}


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


def descending_keys(scores: np.ndarray) -> np.ndarray:
    """int64 keys that sort ascending as float32 scores sort descending, with room for a pool index
    in the low bits (ties then break by that index)."""
    s = (np.asarray(scores, dtype=np.float32) + np.float32(0.0)).view(np.int32)  # +0.0 folds -0.0 into +0.0
    ascending = np.where(s >= 0, s, s ^ np.int32(0x7FFFFFFF)).astype(np.int64)
    return (-ascending) << _INDEX_BITS


def select_top(scores: np.ndarray, count: int) -> np.ndarray:
    """[B, count] pool indices of the ``count`` best entries per row, best first.

    Order: higher score, then lower pool index (so a pool laid out in tie-break order gives the
    documented order). Exact under ties: scores and indices form one unique int64 key.
    """
    width = scores.shape[1]
    if width >= 1 << _INDEX_BITS:
        raise TreeError(f"selection pool of {width} entries is too large", where="replay.trees",
                        fix="use a smaller node budget or depth cap")
    keys = descending_keys(scores) | np.arange(width, dtype=np.int64)[None, :]
    if count < width:
        keys = np.partition(keys, count - 1, axis=1)[:, :count]
    return np.sort(keys, axis=1) & ((1 << _INDEX_BITS) - 1)


def level_search(logp: np.ndarray, cand: np.ndarray, nodes: int, depth_cap: int | None,
                 expand: int | None = None, children: int | None = None) -> DraftTrees:
    """The top-``nodes`` nodes by path score, level by level, for a batch of steps.

    logp [B, m, P, K] float32: log-prob of candidate j at position d given candidate i at d-1
    (P = K for parent-conditioned scores, P = 1 for marginals); cand [B, m, K].

    Why it is exact: a node in the global top-N has fewer than N better nodes, so it is in the top-N
    of its own depth, and its parent (never worse, and shallower) is in the global top-N too. So
    keeping the top-N of each depth, expanding only those, and taking the top-N of the union gives
    the global top-N. ``expand``/``children`` restrict the search (EAGLE-2: expand the top-k of each
    depth, each with its top-k children); left ``None`` the search is the exact best-first tree.
    Pools are kept in (depth, lexicographic) order, so ``select_top``'s index tie-break is the
    documented one.
    """
    b, m, _, k = logp.shape
    depth = m if depth_cap is None else max(0, min(depth_cap, m))
    expand = nodes if expand is None else expand
    rows = np.arange(b)[:, None]
    parent_rank = np.zeros((b, 1), dtype=np.int64)  # the root reads row 0 of logp[:, 0] (all rows equal)
    parent_score = np.zeros((b, 1), dtype=np.float32)
    parent_pool = np.full((b, 1), -1, dtype=np.int64)
    pools: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []
    offset = 0
    for d in range(depth):
        if parent_rank.shape[1] == 0 or nodes == 0:
            break
        level = logp[:, d]
        edge = level[rows, np.minimum(parent_rank, level.shape[1] - 1)]  # [B, P, K]
        if children is not None and children < k:
            child = np.sort(select_top(edge.reshape(-1, k), children), axis=1).reshape(b, -1, children)
            edge = np.take_along_axis(edge, child, axis=-1)
        else:
            child = np.broadcast_to(np.arange(k), edge.shape)
        c = edge.shape[-1]
        score = (parent_score[:, :, None] + edge).reshape(b, -1)  # float32 sum, root to node
        take = min(nodes, score.shape[1])
        kept = np.sort(select_top(score, take), axis=1)  # lexicographic order inside the depth
        kept_score = np.take_along_axis(score, kept, axis=1)
        kept_rank = np.take_along_axis(child.reshape(b, -1), kept, axis=1)
        kept_parent = np.take_along_axis(parent_pool, kept // c, axis=1)
        pools.append((kept_score, kept_rank, kept_parent, d + 1))
        cols = np.arange(take)[None, :].repeat(b, 0) if expand >= take else np.sort(select_top(kept_score, expand), axis=1)
        parent_rank = np.take_along_axis(kept_rank, cols, axis=1)
        parent_score = np.take_along_axis(kept_score, cols, axis=1)
        parent_pool = offset + cols
        offset += take
    return assemble(pools, cand, nodes)


def assemble(pools, cand: np.ndarray, nodes: int) -> DraftTrees:
    """Top-``nodes`` of the union of per-depth pools [(score, rank, parent pool index, depth)], in
    best-first order, as a ``DraftTrees`` batch."""
    b = cand.shape[0]
    if not pools or nodes == 0:
        return empty_trees(b, nodes)
    scores = np.concatenate([p[0] for p in pools], axis=1)
    ranks = np.concatenate([p[1] for p in pools], axis=1)
    parent_pool = np.concatenate([p[2] for p in pools], axis=1)
    depths = np.concatenate([np.full(p[0].shape, p[3], dtype=np.int64) for p in pools], axis=1)
    n = min(nodes, scores.shape[1])
    sel = select_top(scores, n)
    rows = np.arange(b)[:, None]
    position = np.full(scores.shape, -1, dtype=np.int64)
    position[rows, sel] = np.arange(n)[None, :]
    sel_score = scores[rows, sel]
    valid = sel_score > -np.inf
    sel_parent = parent_pool[rows, sel]
    parents = np.where(valid & (sel_parent >= 0), position[rows, np.maximum(sel_parent, 0)], -1)
    sel_depth = np.where(valid, depths[rows, sel], 0)
    sel_rank = np.where(valid, ranks[rows, sel], -1)
    tokens = np.where(valid, cand[rows, np.maximum(sel_depth - 1, 0), np.maximum(sel_rank, 0)], -1)
    trees = DraftTrees(parents, sel_depth, sel_rank, tokens.astype(np.int64),
                       np.where(valid, sel_score, -np.inf).astype(np.float32), valid.sum(axis=1).astype(np.int64))
    return pad_trees(trees, nodes)


def empty_trees(b: int, nodes: int) -> DraftTrees:
    return DraftTrees(np.full((b, nodes), -1, np.int64), np.zeros((b, nodes), np.int64),
                      np.full((b, nodes), -1, np.int64), np.full((b, nodes), -1, np.int64),
                      np.full((b, nodes), -np.inf, np.float32), np.zeros(b, np.int64))


def pad_trees(trees: DraftTrees, nodes: int) -> DraftTrees:
    """Pad to exactly ``nodes`` columns so every builder returns [B, N] arrays."""
    extra = nodes - trees.parents.shape[1]
    if extra <= 0:
        return trees
    pad = lambda a, v: np.concatenate([a, np.full((a.shape[0], extra), v, dtype=a.dtype)], axis=1)  # noqa: E731
    return DraftTrees(pad(trees.parents, -1), pad(trees.depths, 0), pad(trees.ranks, -1), pad(trees.tokens, -1),
                      pad(trees.scores, -np.inf), trees.num_nodes)


def chain_trees(ranks: np.ndarray, scores: np.ndarray, cand: np.ndarray, lengths: np.ndarray, nodes: int) -> DraftTrees:
    """Chains as trees: ranks/scores [B, L] along the chain, lengths [B] nodes kept, padded to ``nodes``."""
    b, length = ranks.shape
    idx = np.arange(length)[None, :]
    valid = idx < lengths[:, None]
    rows = np.arange(b)[:, None]
    depth = np.broadcast_to(idx + 1, (b, length))
    tokens = cand[rows, np.minimum(depth - 1, cand.shape[1] - 1), np.maximum(ranks, 0)] if length else ranks
    trees = DraftTrees(np.where(valid, idx - 1, -1), np.where(valid, depth, 0), np.where(valid, ranks, -1),
                       np.where(valid, tokens, -1).astype(np.int64),
                       np.where(valid, scores, -np.inf).astype(np.float32), lengths.astype(np.int64))
    return pad_trees(trees, nodes)
