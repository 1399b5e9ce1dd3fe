"""``prompt-admission``'s flags, checked while SGLang parses its arguments, and the settings its runtime reads."""

from __future__ import annotations

from dataclasses import dataclass

from sglang.srt.specpilot.batching_args import BatchingArgumentError
from sglang.srt.specpilot.batching_checks.shared_budget import check as budget_check

ADMISSION_FLAG = "--specpilot-prompt-admission"
SEGMENT_FLAG = "--specpilot-prompt-segment"


@dataclass(frozen=True)
class AdmissionSettings:
    """segment: the most prompt rows one verify step carries (None: the scheduler's chunked-prefill size);
    buffers: the rows the verify step's buffers hold (a segment rides beside at least one request's root)."""

    segment: int | None
    buffers: int


def admission_settings(enabled, segment, *, budget, nodes, max_running_requests) -> AdmissionSettings | None:
    """Checked settings (None: flags unset, stock). ``budget``: shared-budget's checked settings (None: unset);
    ``nodes``: ``--specpilot-tree-nodes``."""
    if not enabled:
        if segment is not None:
            raise BatchingArgumentError(SEGMENT_FLAG, f"is set without {ADMISSION_FLAG}",
                                        f"give {ADMISSION_FLAG}, or drop the flag")
        return None
    if budget is None:
        raise BatchingArgumentError(ADMISSION_FLAG, "rides prompt rows in the shared budget's ragged verify, and no "
                                    "shared budget is set",
                                    "give --specpilot-shared-budget-rows or --specpilot-shared-budget-costs")
    if budget.rows is not None:
        buffers, where = budget.rows, f"--specpilot-shared-budget-rows {budget.rows}"
    elif max_running_requests is not None:
        buffers = int(max_running_requests) * (int(nodes) + 1)
        where = f"{max_running_requests} requests x {int(nodes) + 1} tokens"
    else:
        raise BatchingArgumentError(ADMISSION_FLAG, "sizes its rows by the verify buffers, and the requests in flight "
                                    "are unbounded", "give --max-running-requests")
    if segment is not None and not 1 <= int(segment) <= buffers - 1:
        raise BatchingArgumentError(SEGMENT_FLAG, f"{segment} rows do not fit the verify buffers ({buffers} rows: "
                                    f"{where}; one is a decoding request's root)",
                                    f"give a segment of 1..{buffers - 1} rows")
    return AdmissionSettings(None if segment is None else int(segment), buffers)


def check(server_args) -> AdmissionSettings | None:
    enabled = getattr(server_args, "specpilot_prompt_admission", False)
    segment = getattr(server_args, "specpilot_prompt_segment", None)
    if not enabled and segment is None:
        return None
    return admission_settings(enabled, segment, budget=budget_check(server_args),
                              nodes=getattr(server_args, "specpilot_tree_nodes", None),
                              max_running_requests=getattr(server_args, "max_running_requests", None))
