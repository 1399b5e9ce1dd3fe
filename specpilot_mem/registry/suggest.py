"""``deploy new --suggest``: the entries a new deployment should start from, each with its reasons.

As the paper's master does (§3.4), a new deployment starts from stock plus validated entries that fit it:

- an entry is proposed when it is validated (timed end to end on real weights, never rejected), matches
  the hardware (evidence on the GPU, on another GPU of its arch, or a variant built for the arch), and
  was measured in the deployment's regime;
- its reasons say which hardware match it is, and whether it was measured with the same drafter family
  or the same target model;
- its flags name what was never checked for this deployment: untested regimes, GPUs, drafters and
  models the entry lists, a variant never run on the arch, a drafter family never measured;
- the requirements of every proposed entry are pulled in (they must be applied anyway), each with the
  entries that need it, and flagged when they would not have been proposed on their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from specpilot_mem.gpus import GPU
from specpilot_mem.registry.query import (
    REQUIREMENT_CLOSURE, EntryMatch, QueryFilters, query_entries, untested_relevant,
)
from specpilot_mem.registry.sync import drafter_family


@dataclass
class Suggestion:
    id: str
    title: str
    reasons: list[str]
    flags: list[str] = field(default_factory=list)
    required_by: list[str] = field(default_factory=list)  # proposed entries that need this one

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons + [f"untested: {f}" for f in self.flags])


def suggest_entries(con: duckdb.DuckDBPyConnection, *, gpu: GPU | None, arch: str, model: str, drafter: str,
                    regime: str) -> list[Suggestion]:
    """Proposed entries (proposals first, then pulled-in requirements), each with reasons and flags."""
    hardware = gpu.name if gpu else arch
    setting = QueryFilters(gpu=hardware, model=model, drafter=drafter, regime=regime)
    matches = {m.id: m for m in query_entries(con, QueryFilters(gpu=hardware, validated_only=True))}
    in_regime = {m.id for m in query_entries(con, QueryFilters(gpu=hardware, regime=regime, validated_only=True))}
    same_model = {m.id for m in query_entries(con, QueryFilters(gpu=hardware, model=model))}
    family = drafter_family(drafter)

    proposed: dict[str, Suggestion] = {}
    for entry_id, match in matches.items():
        if entry_id not in in_regime:
            continue
        reasons = [match.hardware_note, f"measured in the {regime} regime"]
        flags = _flags(match, gpu, arch, setting)
        families = {drafter_family(d) for d in match.drafters}
        if family in families:
            reasons.append(f"measured with the {family} drafter family")
        else:
            flags.append(f"never measured with the {family} drafter family (measured with {', '.join(match.drafters) or 'no drafter'})")
        if entry_id in same_model:
            reasons.append(f"measured on {model}")
        proposed[entry_id] = Suggestion(entry_id, match.title, reasons, flags)

    required = _requirements(con, sorted(proposed))
    pulled: dict[str, Suggestion] = {}
    for entry_id, needed_by in sorted(required.items()):
        if entry_id in proposed:
            proposed[entry_id].required_by = needed_by
            continue
        title = con.execute("SELECT title FROM entries WHERE id = ?", [entry_id]).fetchone()
        suggestion = Suggestion(entry_id, title[0] if title else entry_id, [f"required by {', '.join(needed_by)}"],
                                required_by=needed_by)
        match = matches.get(entry_id)
        if match is None:
            suggestion.flags.append(f"not validated on {hardware} on its own")
        else:
            suggestion.reasons.append(match.hardware_note)
            if entry_id not in in_regime:
                suggestion.flags.append(f"not measured in the {regime} regime")
            suggestion.flags.extend(_flags(match, gpu, arch, setting))
        pulled[entry_id] = suggestion
    return list(proposed.values()) + list(pulled.values())


def _flags(match: EntryMatch, gpu: GPU | None, arch: str, setting: QueryFilters) -> list[str]:
    """What the entry never checked for this deployment: listed untested items it names, a variant never run."""
    flags = [u["note"] for u in match.untested if untested_relevant(u, gpu, arch, setting)]
    if match.hardware == "variant":
        flags.append(match.hardware_note)
    return flags


def _requirements(con: duckdb.DuckDBPyConnection, ids: list[str]) -> dict[str, list[str]]:
    """Every entry in the requirement closure of ``ids`` -> the entries of ``ids`` that need it."""
    if not ids:
        return {}
    rows = con.execute(
        f"WITH RECURSIVE {REQUIREMENT_CLOSURE.rstrip().rstrip(',')} "
        "SELECT req, list(DISTINCT entry_id ORDER BY entry_id) FROM closure WHERE list_contains($ids, entry_id) GROUP BY req",
        {"ids": ids},
    ).fetchall()
    return {req: list(needed_by) for req, needed_by in rows}
