"""The ``gdn-tree`` entry: GDN target-verify along root paths, commit by replay, no per-node state."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="gdn-tree",
    options=(
        Option(
            "--specpilot-gdn-tree-verify",
            "bool",
            False,
            "GDN layers verify draft trees and chains with the path kernel (each node's output along its root "
            "path from the committed state) and commit by replaying the accepted path; the per-draft-token "
            "state buffer (intermediate_ssm) is not allocated.",
        ),
    ),
)
