"""Prompt admission (§4.4): a waiting prompt's rows enter the verify step, so one weight stream serves
decoding and prefill, instead of a separate prefill pass that stalls every request in flight.

Rows are admitted only from the plateau of the target's measured c(R): the rows between those a step
verifies anyway and the plateau's end cost (nearly) nothing, so admission never makes a verify step
dearer. Where those rows already reach the end of a plateau — compute does not idle — nothing is
admitted and the scheduler prefills as stock does. Prompt rows take precedence over a shared budget's
tree nodes (the nodes it drops are its least likely ones).

Two forms: ``segment`` rows at a time (fixed-size segments, one prompt per segment: static shapes for
CUDA graphs), or, with ``segment=None``, a chain of as many prompt rows as the plateau has spare
(waiting prompts in arrival order). ``pays`` says whether admission beats a separate prefill pass at
all (a prompt that would trickle in through a few spare rows is better prefilled on its own).
"""

from __future__ import annotations

import torch

from specpilot_mem.batching.costs import BatchingError, CostCurve


class PromptAdmission:
    FLAG = "--prompt-segment"

    def __init__(
        self,
        curve: CostCurve,
        verify_buffer: int,
        segment: int | None = 64,
        tolerance: float = 0.05,
        always: bool = False,
    ):
        if segment is not None and not 1 <= segment <= verify_buffer:
            raise BatchingError(
                f"{self.FLAG}={segment} does not fit the verify buffers ({verify_buffer} rows)",
                where=self.FLAG,
                fix=f"use a segment of 1..{verify_buffer} rows, or larger verify buffers",
            )
        self.curve, self.verify_buffer, self.segment, self.tolerance = curve, verify_buffer, segment, tolerance
        self.always = always  # admit whenever the plateau has spare rows, without weighing a prefill pass

    def spare_rows(self, rows: int) -> int:
        """Rows on the plateau past a step's ``rows`` verify rows (0: compute does not idle). A step with
        nothing to verify has no plateau to share: prompts are prefilled on their own."""
        if rows <= 0:
            return 0
        return max(0, self.curve.plateau_end(rows, self.tolerance, self.verify_buffer) - rows)

    def plan(self, rows: int, waiting: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt rows to admit this step.

        Args:
            rows: the verify rows the step needs anyway (the roots, plus the drafts of a fixed shape such
                as stock's chains; a shared budget's nodes give way to prompt rows).
            waiting: [P] int64 rows each waiting prompt still has to prefill, in arrival order.

        Returns (admitted [P] int64 rows of each prompt in this step, rows [] int64 verify rows they take:
        whole segments in segment form, the admitted rows in chain form).
        """
        spare = self.spare_rows(rows)
        waiting = waiting.to(torch.int64)
        before = waiting.cumsum(0) - waiting
        if self.segment is None:
            admitted = (spare - before).clamp(min=0).minimum(waiting)
            return admitted, admitted.sum()
        segments = (waiting + self.segment - 1) // self.segment
        seg_before = segments.cumsum(0) - segments
        given = (spare // self.segment - seg_before).clamp(min=0).minimum(segments)
        return (given * self.segment).minimum(waiting), given.sum() * self.segment

    def pays(
        self,
        rows: int,
        waiting_rows: int,
        requests: int,
        step_ms: float,
        prefill_ms: float,
        tau: float = 1.0,
        row_value: float = 0.0,
    ) -> bool:
        """Whether admitting beats a prefill pass of its own, in tokens lost. Admission: the waiting
        prompts' slots idle for the steps their rows take to enter (``waiting_rows`` over the plateau's
        spare rows, segment-rounded), each losing ``tau`` tokens, and every admitted row displaces a tree
        node worth ``row_value`` expected tokens (0 where nothing would use the row). A pass: every
        request in flight and the new ones idle for ``prefill_ms`` (in steps of ``step_ms``)."""
        spare = self.spare_rows(rows)
        if self.segment is not None:
            spare -= spare % self.segment
        if spare <= 0:
            return False
        if self.always:
            return True
        steps = -(-waiting_rows // spare)
        return steps * tau + waiting_rows * row_value < (requests + 1) * tau * prefill_ms / step_ms
