"""Draft-tree builders, one module each. Every builder is

    build(batch: StepBatch, nodes: int, depth_cap: int | None = None, **options) -> DraftTrees

returning prefix-closed trees (parents, depths, candidate ranks, tokens) ready for
``base.verify_mask``. ``BUILDERS`` maps the CLI names to them.
"""

from __future__ import annotations

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.replay.trees import best_first, chain, ddtree, eagle2, oracle, sequoia
from specpilot_mem.replay.trees.base import DraftTrees, StepBatch, ancestor_mask, verify_mask

BUILDERS = {
    "chain": chain.build,
    "best-first": best_first.build,
    "ddtree": ddtree.build,
    "eagle2": eagle2.build,
    "sequoia": sequoia.build,
    "oracle": oracle.build,
}

__all__ = ["BUILDERS", "DraftTrees", "StepBatch", "ancestor_mask", "verify_mask", "get_builder"]


def get_builder(name: str):
    try:
        return BUILDERS[name]
    except KeyError:
        raise SpecPilotError(
            f"unknown tree builder {name!r}", where="--builders", fix="use any of: " + ", ".join(BUILDERS)
        ) from None
