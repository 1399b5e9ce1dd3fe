"""DDTree: best-first over marginal per-depth scores.

Every candidate at depth d scores log_softmax(unary)[d] whatever its parent, and the tree keeps the
N best path sums. DDTree enumerates them with a heap (pop the best, push its next sibling and its
first child); with parent-independent scores that yields exactly the top-N path sums, which
``base.best_first_search`` computes for a batch at once (ties as documented in ``base``).
"""

from __future__ import annotations

from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, best_first_search


def build(batch: StepBatch, nodes: int, depth_cap: int | None = None) -> DraftTrees:
    return best_first_search(batch, nodes, depth_cap, marginal=True)
