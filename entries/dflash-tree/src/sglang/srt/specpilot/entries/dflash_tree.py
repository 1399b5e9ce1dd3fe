"""The ``dflash-tree`` entry: best-first draft trees on the DFlash2 selector lattice, verified as trees."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="dflash-tree",
    options=(
        Option(
            "--specpilot-tree-nodes",
            "int",
            None,
            "Node budget N of a best-first draft tree built from the DFlash2 selector lattice (top-K candidates "
            "per drafted position, log-softmax of the selector scores given each node's parent); the target "
            "verifies the N nodes and the root as one tree. Unset: stock DFlash's chain.",
        ),
        Option(
            "--specpilot-tree-depth",
            "int",
            None,
            "Deepest level of the draft tree (at most the drafted positions); unset: the drafted positions, capped "
            "at what the tree kernel's tie-break code holds (15 levels with K = 16 candidates).",
        ),
        Option(
            "--specpilot-tree-drafted-positions",
            "int",
            None,
            "Positions the drafter drafts per step when trees are on (a block of this many masked positions "
            "after the anchor; may exceed the drafter's trained block, e.g. 16 for wide trees); unset: the "
            "drafter's block size minus the anchor.",
        ),
    ),
)
