"""Best-first tree (the paper's §4.2): the N nodes with the highest path score
Σ log p(child | parent), where the children of a node at depth d are scored by log_softmax, over
the K candidates of position d, of the selector (or Markov-head) scores given the node's candidate.

The paper builds it with a heap (pop the best node, push its children). This builds the same set,
in the same best-first order, for a whole batch of steps at once (``base.best_first_search``: depth
by depth over flat lists, expanding only nodes above a lower bound of the N-th best score). Ties:
see ``base`` (score, then depth, then the candidate-index path in lexicographic order).
"""

from __future__ import annotations

from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, best_first_search


def build(batch: StepBatch, nodes: int, depth_cap: int | None = None) -> DraftTrees:
    return best_first_search(batch, nodes, depth_cap)
