"""The ``certified-head`` entry: the greedy argmax from an INT8 copy of the LM head, certified exact."""

from sglang.srt.specpilot import EntrySpec, Option

ENTRY = EntrySpec(
    id="certified-head",
    options=(
        Option(
            "--specpilot-certified-head",
            "bool",
            False,
            "Greedy target forwards that need no log-probs take the LM head's argmax from its INT8 copy with "
            "a per-row error bound and exact rescoring of the survivors (eager and CUDA-graph forwards, one GPU "
            "head).",
        ),
    ),
)
