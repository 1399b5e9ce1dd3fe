"""Prompt admission (§4.4): a waiting prompt's rows enter the verify step, so one weight stream serves
decoding and prefill, instead of a separate prefill pass that stalls every request in flight.

Rows are admitted only from the plateau of the target's measured c(R): the rows between the batch's
roots and the plateau's end cost (nearly) nothing, so admission never makes a verify step dearer. Where
the roots alone already reach the end of a plateau — compute does not idle — nothing is admitted and the
scheduler prefills as stock does. Prompt rows take precedence over tree nodes within the plateau (the
nodes the budget drops are its least likely ones).

Two forms: ``segment`` rows at a time (fixed-size segments, one prompt per segment: static shapes for
CUDA graphs), or, with ``segment=None``, a chain of as many prompt rows as the plateau has spare
(waiting prompts in arrival order).
"""

from __future__ import annotations

import torch

from specpilot_mem.batching.costs import BatchingError, CostCurve


class PromptAdmission:
    FLAG = "--prompt-segment"

    def __init__(self, curve: CostCurve, verify_buffer: int, segment: int | None = 64, tolerance: float = 0.03):
        if segment is not None and not 1 <= segment <= verify_buffer:
            raise BatchingError(f"{self.FLAG}={segment} does not fit the verify buffers ({verify_buffer} rows)",
                                where=self.FLAG, fix=f"use a segment of 1..{verify_buffer} rows, or larger verify buffers")
        self.curve, self.verify_buffer, self.segment, self.tolerance = curve, verify_buffer, segment, tolerance

    def spare_rows(self, requests: int) -> int:
        """Rows on the plateau past the roots of ``requests`` requests (0: compute does not idle)."""
        return max(0, self.curve.plateau_end(requests, self.tolerance, self.verify_buffer) - requests)

    def plan(self, requests: int, waiting: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt rows to admit this step.

        Args:
            requests: requests in flight (their roots are in the step).
            waiting: [P] int64 rows each waiting prompt still has to prefill, in arrival order.

        Returns (admitted [P] int64 rows of each prompt in this step, rows [] int64 verify rows they take:
        whole segments in segment form, the admitted rows in chain form).
        """
        spare = self.spare_rows(requests)
        waiting = waiting.to(torch.int64)
        before = waiting.cumsum(0) - waiting
        if self.segment is None:
            admitted = (spare - before).clamp(min=0).minimum(waiting)
            return admitted, admitted.sum()
        segments = (waiting + self.segment - 1) // self.segment
        seg_before = segments.cumsum(0) - segments
        given = (spare // self.segment - seg_before).clamp(min=0).minimum(segments)
        return (given * self.segment).minimum(waiting), given.sum() * self.segment
