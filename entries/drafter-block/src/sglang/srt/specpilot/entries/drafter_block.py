"""The ``drafter-block`` entry: a drafter block per request (16, 12 or 8), its tree depth capped to match."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="drafter-block",
    options=(
        Option(
            "--specpilot-drafter-blocks",
            "str",
            None,
            "Drafter blocks a request may draft, comma-separated (e.g. 16,12,8; each 1..the drafted positions): every "
            "step each request's block is chosen on the GPU from its recent acceptance and draft confidence, and its "
            "tree's depth is capped at it. Blocks stay the largest while the batch's drafter rows fit the plateau of "
            "--specpilot-drafter-costs; past it, the requests of least need shrink first. Needs the shared budget. "
            "Unset: every request drafts the whole block.",
        ),
        Option(
            "--specpilot-drafter-costs",
            "str",
            None,
            'The drafter pass\'s measured c(R) on this GPU, a JSON file {"rows": [...], "ms": [...]} (block + anchor '
            "rows per request): the plateau the drafter's rows are kept within. Needed with --specpilot-drafter-blocks.",
        ),
    ),
)
