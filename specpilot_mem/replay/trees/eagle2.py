"""EAGLE-2 top-k tree: expand the k best nodes of each depth (by path score over the
parent-conditioned scores), each with its k best children, then keep the N best of all expanded
nodes. k = 4 is the paper's comparison point ("an EAGLE-2-style top-4 tree", §6.4).
"""

from __future__ import annotations

from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, level_search

DEFAULT_TOP_K = 4


def build(batch: StepBatch, nodes: int, depth_cap: int | None = None, top_k: int = DEFAULT_TOP_K) -> DraftTrees:
    return level_search(batch, nodes, depth_cap, expand=top_k, children=top_k)
