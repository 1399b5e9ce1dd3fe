"""Draft trees for the engine's verify pass, built by the replay package's builders (one definition of
every builder for live decoding and exact replay)."""

from __future__ import annotations

from specpilot_mem.engine.drafter import Lattice
from specpilot_mem.replay.trees import StepBatch, get_builder


def build_tree(builder: str, lattice: Lattice, nodes: int, depth_cap: int | None = None) -> tuple[list[int], list[int]]:
    """Tokens and parent indices (-1: child of the root) of the ``builder``'s tree on one lattice."""
    batch = StepBatch.from_scores(lattice.cand[None], lattice.unary[None], lattice.pair[None], kind="selector")
    tree = get_builder(builder)(batch, nodes, depth_cap).tree(0)
    return [int(t) for t in tree["tokens"]], [int(p) for p in tree["parents"]]
