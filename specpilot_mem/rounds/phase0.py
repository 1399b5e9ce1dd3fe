"""Phase 0's report: the cost model's ceiling factors for the system the round starts from.

The system's repo names its profile and recorded lattices in ``specpilot-system.json``
(``"profile": "path.json"``, ``"lattices": ["a.npz", ...]``, written by its engine; formats in
docs/profile-format.md and docs/lattice-format.md). Without them the report says so, and the
master plans from the memory and the calibration alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from specpilot_mem.home import Home
from specpilot_mem.rounds.files import RoundDir
from specpilot_mem.rounds.models import RoundState
from specpilot_mem.rounds.systems import system_spec


def cost_model_report(home: Home, checkout: Path, state: RoundState, round_dir: RoundDir) -> dict:
    spec = system_spec(checkout)
    calibration = next(json.loads(p.read_text()) for p in (round_dir.path / "measurements").glob("calibrate-*.json"))
    report: dict = {"system": state.start, "delta": calibration["delta"], "noise": calibration["noise"]["noise"]}
    profile, lattices = spec.get("profile"), spec.get("lattices")
    if not profile or not lattices:
        report["ceiling"] = None
        report["why"] = "the system names no profile and lattices in specpilot-system.json"
        return report
    from specpilot_mem.costmodel import ceiling_report

    report["ceiling"] = ceiling_report(checkout / profile, [checkout / p for p in lattices])
    return report
