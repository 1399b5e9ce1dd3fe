"""The ``prompt-admission`` entry: a waiting prompt's chunk rides in the shared-budget verify step."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="prompt-admission",
    options=(
        Option(
            "--specpilot-prompt-admission",
            "bool",
            False,
            "A middle chunk of the chunked prefill (never the prompt's last chunk) rides in the decode step's "
            "shared-budget verify as one more ragged request, its rows in place of the budget's lowest nodes, "
            "instead of a prefill batch that stalls every request in flight; only where that is estimated to "
            "lose fewer tokens than the prefill pass. Needs --specpilot-shared-budget-rows or "
            "--specpilot-shared-budget-costs. Unset: stock's prefill batches.",
        ),
        Option(
            "--specpilot-prompt-segment",
            "int",
            None,
            "The most prompt rows one verify step carries (a longer chunk is prefilled as stock does); at most "
            "what the verify buffers hold past the requests' roots. Unset: --chunked-prefill-size.",
        ),
    ),
)
