"""The ``shared-budget`` entry: one node budget per verify step, shared over the batch's best-first trees."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="shared-budget",
    options=(
        Option(
            "--specpilot-shared-budget-rows",
            "int",
            None,
            "Verify rows per step (roots included) shared by the batch: every request keeps its root, the rest go "
            "to the top nodes by path log-probability over all requests' best-first trees (each share a prefix of "
            "its request's tree, so a valid tree), verified as one ragged pass. Needs --specpilot-tree-nodes (the "
            "most nodes one request may take) and --max-running-requests at most this. Unset: dflash-tree's "
            "per-request trees.",
        ),
        Option(
            "--specpilot-shared-budget-costs",
            "str",
            None,
            'The target verify pass\'s measured c(R) on this GPU, a JSON file {"rows": [...], "ms": [...]}: the '
            "budget of a step with B requests is the end of the plateau the B roots are on (rows past them cost "
            "nearly nothing until the next tile). Instead of --specpilot-shared-budget-rows. Unset: no shared budget.",
        ),
    ),
)
