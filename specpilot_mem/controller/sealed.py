"""The sealed final (§3.2, Phase 4): the round's system against stock on requests the agents never saw.

It runs only ``unseen`` requests (a dev request in the list is an error), times the candidate
against stock in paired runs (two by default, as in the paper), and reruns token forcing on the
candidate's outputs. The final is accepted only if the gain's 95% lower bound is above 1 and token
forcing accepts: a verdict of ``inconclusive`` (the sample could not have seen a lossy system) is not
an accept, and its reasons say what sample would suffice. ``require_conclusive=False`` reports an
inconclusive verdict without refusing the final on it (smoke rounds on a few short outputs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specpilot_mem.controller.gains import GainEstimate, Run
from specpilot_mem.controller.paired import PairedResult, paired_run
from specpilot_mem.controller.requests import Request, require_split
from specpilot_mem.controller.system import RequestOutput, System
from specpilot_mem.forcing.verdict import Verdict

# Token forcing as the sealed final needs it: (candidate outputs, stock outputs) by request id -> verdict.
Forcing = Callable[[dict[str, RequestOutput], dict[str, RequestOutput]], Verdict]


@dataclass(frozen=True)
class SealedFinal:
    accepted: bool
    reasons: tuple[str, ...]
    gain: GainEstimate
    verdict: Verdict
    paired: PairedResult

    def to_dict(self) -> dict:
        return {
            "accepted": self.accepted,
            "reasons": list(self.reasons),
            "gain": self.gain.to_dict(),
            "verdict": self.verdict.to_dict(),
            "paired": self.paired.to_dict(),
        }


def _first_outputs(runs: Sequence[Run]) -> dict[str, RequestOutput]:
    """The outputs of the first run at the smallest batch size: what token forcing scores."""
    first = min(runs, key=lambda r: (r.batch_size, r.repeat))
    return {o.id: o for o in first.outputs}


def sealed_final(
    candidate: System,
    stock: System,
    requests: Sequence[Request],
    *,
    forcing: Forcing,
    batch_sizes: Sequence[int] = (1,),
    repeats: int = 2,
    devices: Sequence[str] = ("cuda:0",),
    on_run: Callable[[Run], None] | None = None,
    require_conclusive: bool = True,
) -> SealedFinal:
    require_split(requests, "unseen", "the sealed final")
    paired = paired_run(
        stock, candidate, requests, batch_sizes=batch_sizes, repeats=repeats, devices=devices, on_run=on_run
    )
    return judge_final(paired, requests, forcing, require_conclusive=require_conclusive)


def judge_final(
    paired: PairedResult, requests: Sequence[Request], forcing: Forcing, *, require_conclusive: bool = True
) -> SealedFinal:
    """The sealed final's verdict on a paired run of stock (a) against the candidate (b), however it
    was run (in this process, or each system in its own worker process)."""
    require_split(requests, "unseen", "the sealed final")
    estimate = paired.gain(requests)
    verdict = forcing(_first_outputs(paired.runs_b), _first_outputs(paired.runs_a))
    reasons = []
    if estimate.low <= 1.0:
        reasons.append(f"gain over stock {estimate.gain:.4f} has 95% lower bound {estimate.low:.4f}, not above 1")
    if verdict.verdict == "reject" or (verdict.verdict == "inconclusive" and require_conclusive):
        reasons.extend(verdict.reasons)
    return SealedFinal(not reasons, tuple(reasons), estimate, verdict, paired)
