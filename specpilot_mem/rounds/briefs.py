"""What each agent is told: the master's, a sub-agent's, the integration and kernel agents' briefs."""

from __future__ import annotations

import json

from specpilot_mem.home import Home
from specpilot_mem.rounds.files import RoundDir
from specpilot_mem.rounds.models import (
    MAX_GPU_MINUTES_TO_CLOSE_UNMEASURED,
    MIN_NET_HEADROOM,
    DirectionRecord,
    DirectionSpec,
    RoundState,
)

_HEADROOM = (
    "Before building, check the headroom with the cheapest evidence (exact replay, a microbenchmark, or "
    'one timing run) and write `{notes}/headroom.json`: {{"evidence": "replay|microbenchmark|timing|'
    'byte-arithmetic", "headroom": 0.12, "overhead": 0.02, "gpu_minutes_to_measure": 3, "notes": "..."}} '
    "(fractions: 0.12 = 12%). Build only if headroom minus overhead is at least {min_net:.0%}. If you build, "
    "the controller measures it; if measuring would take over {max_min:g} GPU-minutes you may close the "
    "direction unbuilt and say so there."
)
_RULES = (
    "Put every change behind an option whose default reproduces stock. Do not edit controller, benchmark "
    "or request files ({protected}): such a direction is rejected. Do not commit: leave your changes in the "
    "worktree; the runner commits them. Development requests are in `{notes}/requests-dev.jsonl`; the "
    "cost-model report is `{notes}/cost-model.json`. Optionally describe the mechanism for the memory in "
    "`{notes}/entry.yaml` (title, summary, options, limits, untested)."
)


def _common(state: RoundState, notes: str) -> str:
    return (
        _HEADROOM.format(notes=notes, min_net=MIN_NET_HEADROOM, max_min=MAX_GPU_MINUTES_TO_CLOSE_UNMEASURED)
        + "\n\n"
        + _RULES.format(notes=notes, protected=", ".join(state.config.protected_paths))
    )


def master_brief(home: Home, state: RoundState, report: dict, closed: list[dict]) -> str:
    from specpilot_mem.store import load_entries

    entries = [
        {"id": e.id, "title": e.title, "requires": e.requires, "limits": e.limits} for e in load_entries(home).values()
    ]
    return (
        f"You are the master agent of round {state.number} of deployment {state.deployment!r}.\n\n"
        f"Cost-model report (phase 0):\n{json.dumps(report, indent=2)}\n\n"
        f"Memory entries available:\n{json.dumps(entries, indent=2)}\n\n"
        f"Directions closed or rejected in earlier rounds (do not retry them blindly):\n{json.dumps(closed, indent=2)}\n\n"
        f"Propose the most promising directions aimed at the largest ceiling factors, one per device "
        f"({len(state.config.devices)} device(s)), each with an estimated headroom. Write them to "
        "`directions.yaml` in your working folder: {summary: ..., directions: [{id, title, idea, factor: "
        "tau|kernel|overhead|other, headroom: 0.1, cheapest_evidence: replay|microbenchmark|timing|byte-arithmetic, "
        "entry: optional memory entry id}]}."
    )


def direction_brief(state: RoundState, spec: DirectionSpec, notes: str) -> str:
    return (
        f"Direction {spec.id!r} of round {state.number} ({state.deployment}): {spec.title}\n\n{spec.idea}\n\n"
        f"The master estimates {spec.headroom:.0%} headroom on the {spec.factor} factor; check it first by "
        f"{spec.cheapest_evidence}.\n\n" + _common(state, notes)
    )


def integration_brief(state: RoundState, leftovers: list[DirectionRecord], round_dir: RoundDir, notes: str) -> str:
    parts = []
    for record in leftovers:
        measured = [json.loads(round_dir.measurement_file(k).read_text())["gain"] for k in record.measurements]
        parts.append(
            {
                "direction": record.spec.id,
                "branch": record.branch,
                "patch": record.patch,
                "gains": measured,
                "why_not_promoted": record.decision,
            }
        )
    return (
        "Integration: these patches gained too little to be promoted alone. Stack the ones that add up onto "
        f"the current best (your worktree), e.g. with `git cherry-pick -n <patch>`:\n{json.dumps(parts, indent=2)}\n\n"
        + _common(state, notes)
    )


def kernel_brief(state: RoundState, report: dict, notes: str) -> str:
    return (
        "Kernel tuning: profile the current best and tune the kernels furthest from their byte floors "
        f"(the cost-model report lists the kernel classes and floors).\n\n{json.dumps(report, indent=2)}\n\n"
        + _common(state, notes)
    )
