"""Greedy tree verification: a node is accepted when its token is the target's argmax after its
parent and its parent is accepted; the step accepts the deepest accepted node's path plus the
target's argmax after it (the bonus token), so τ = accepted nodes + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specpilot_mem.replay.trees.base import DraftTrees


@dataclass
class Verdict:
    """accepted [B]: nodes on the accepted path; deepest [B]: its last node (-1: only the root)."""

    accepted: np.ndarray
    deepest: np.ndarray

    def path(self, trees: DraftTrees, b: int) -> list[int]:
        """Node indices of tree b's accepted path, root side first."""
        out, node = [], int(self.deepest[b])
        while node >= 0:
            out.append(node)
            node = int(trees.parents[b, node])
        return out[::-1]


def accept(trees: DraftTrees, matched: np.ndarray) -> Verdict:
    """matched [B, N] bool: node token equals the target's argmax after its parent."""
    b, n = trees.parents.shape
    if n == 0:
        return Verdict(np.zeros(b, np.int64), np.full(b, -1, np.int64))
    matched = matched & trees.valid
    ok = matched.copy()
    no_parent = trees.parents < 0
    parent_flat = np.arange(b)[:, None] * n + np.maximum(trees.parents, 0)
    for _ in range(int(trees.depths.max(initial=0)) - 1):  # one pass per depth settles every path
        ok = matched & (no_parent | ok.take(parent_flat))
    depth = np.where(ok, trees.depths, 0)
    deepest = np.argmax(depth, axis=1)
    accepted = depth[np.arange(b), deepest]
    return Verdict(accepted.astype(np.int64), np.where(accepted > 0, deepest, -1).astype(np.int64))


def verify_against_greedy(trees: DraftTrees, greedy: np.ndarray) -> Verdict:
    """Replay form: greedy [B, D] holds the target's greedy tokens from the step's position on (-1 past
    the end). On an accepted path the argmax after a node of depth d is greedy[d]."""
    d = greedy.shape[1]
    index = np.clip(trees.depths - 1, 0, max(d - 1, 0))
    expected = np.take_along_axis(greedy, index, axis=1) if d else np.full(trees.depths.shape, -1)
    matched = (trees.tokens == expected) & (trees.depths >= 1) & (trees.depths <= d) & (expected >= 0)
    return accept(trees, matched)


def verify_against_argmax(trees: DraftTrees, argmax: np.ndarray) -> tuple[Verdict, np.ndarray]:
    """Engine form: argmax [B, N+1] is the target's argmax at the root (column 0) and after each node
    (column i+1), from one verify pass with ``verify_mask``. Returns the verdict and the bonus token."""
    parent_col = trees.parents + 1  # the root is column 0
    matched = trees.tokens == np.take_along_axis(argmax, parent_col, axis=1)
    verdict = accept(trees, matched)
    bonus = argmax[np.arange(argmax.shape[0]), verdict.deepest + 1]
    return verdict, bonus
