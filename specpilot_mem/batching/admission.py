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
        waiting_rows,
        requests: int,
        step_ms: float,
        prefill_ms,
        tau: float = 1.0,
        row_value: float = 0.0,
    ) -> bool:
        """Whether admitting every waiting prompt beats prefill passes of their own (``admitted_prompts``)."""
        waiting = torch.as_tensor(waiting_rows, dtype=torch.int64).reshape(-1)
        count = self.admitted_prompts(rows, waiting, requests, step_ms, prefill_ms, tau, row_value)
        return count == waiting.numel()

    def admitted_prompts(
        self,
        rows: int,
        waiting_rows,
        requests: int,
        step_ms: float,
        prefill_ms,
        tau: float = 1.0,
        row_value: float = 0.0,
        committed: int = 0,
        dearer_ms: float | None = None,
    ) -> int:
        """How many of the waiting prompts (from the front, arrival order) to admit; the rest are better prefilled
        now. Prompt j is admitted while admitting it behind the ones before it loses fewer tokens than a prefill pass
        of its own: admitted, its slot idles until its last row is in (prompts enter in arrival order through the
        plateau's spare rows, segment-rounded), its rows make that many steps cost what the curve says they cost
        more (within the plateau's tolerance, every request in flight waits for it), and each displaces a tree node
        worth ``row_value`` expected tokens (0 where nothing would use the row); prefilled, every request in flight
        and it idle for its passes. Idle slot-steps lose ``tau`` tokens each. The first ``committed`` prompts (those
        already entering) stay admitted: their idle steps so far are spent, and flushing them would waste them.

        Args:
            rows: the verify rows the step needs anyway.
            waiting_rows: [P] rows each waiting prompt still has (or their total as one prompt).
            requests: requests decoding in the step.
            step_ms: the step's time.
            prefill_ms: [P] each prompt's prefill passes (or one figure for all of them).
            dearer_ms: how much more a step carrying the admitted rows costs, where it is measured apart from the
                plateau's curve (the engine's mixed step); default: the curve's.
        """
        spare = self.spare_rows(rows)
        if self.segment is not None:
            spare -= spare % self.segment
        waiting = torch.as_tensor(waiting_rows, dtype=torch.int64).reshape(-1)
        if spare <= 0 or waiting.numel() == 0:
            return 0
        if self.always:
            return waiting.numel()
        passes = torch.as_tensor(prefill_ms, dtype=torch.float64).reshape(-1).expand(waiting.numel())
        if self.segment is not None:  # a prompt's last segment takes a whole segment's rows
            waiting = (waiting + self.segment - 1) // self.segment * self.segment
        cum = waiting.cumsum(0)
        dearer = (
            self.curve.at(rows + min(spare, int(cum[-1]))) - self.curve.at(rows) if dearer_ms is None else dearer_ms
        )
        admitted = (-(-cum // spare)) + waiting / spare * requests * dearer / step_ms + waiting * row_value / tau
        pays = admitted < (requests + 1) * passes / step_ms
        pays[:committed] = True
        failing = torch.nonzero(~pays).flatten()
        return int(failing[0]) if failing.numel() else waiting.numel()
