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
  entries that need it, and flagged when they would not have been proposed on their own;
- verified entries are preferred: they come first and say so; a candidate is proposed after them with a
  flag (not verified on its release: re-measure first), or left out with ``verified_only``; a superseded
  entry (upstream already has it) is never proposed;
- every other entry of the memory is left out with why: no evidence or variant for the hardware, not
  validated, or never measured in the regime (so an empty suggestion is never silent).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb

from specpilot_mem.gpus import GPU
from specpilot_mem.registry.query import (
    REQUIREMENT_CLOSURE,
    STATUS_RANK,
    EntryMatch,
    QueryFilters,
    query_entries,
    untested_relevant,
)
from specpilot_mem.registry.sync import drafter_family


@dataclass
class Suggestion:
    id: str
    title: str
    reasons: list[str]
    flags: list[str] = field(default_factory=list)
    required_by: list[str] = field(default_factory=list)  # proposed entries that need this one
    status: str = "candidate"

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons + [f"untested: {f}" for f in self.flags])


def suggest_entries(
    con: duckdb.DuckDBPyConnection,
    *,
    gpu: GPU | None,
    arch: str,
    model: str,
    drafter: str,
    regime: str,
    verified_only: bool = False,
) -> tuple[list[Suggestion], list[Suggestion]]:
    """(proposed entries: verified proposals, then candidates, then pulled-in requirements; each with reasons
    and flags — and the fitting entries left out, with why)."""
    hardware = gpu.name if gpu else arch
    setting = QueryFilters(gpu=hardware, model=model, drafter=drafter, regime=regime)
    matches = {m.id: m for m in query_entries(con, QueryFilters(gpu=hardware, validated_only=True))}
    in_regime = {m.id for m in query_entries(con, QueryFilters(gpu=hardware, regime=regime, validated_only=True))}
    same_model = {m.id for m in query_entries(con, QueryFilters(gpu=hardware, model=model))}
    family = drafter_family(drafter)

    proposed: dict[str, Suggestion] = {}
    left_out: list[Suggestion] = []
    for entry_id, match in sorted(matches.items(), key=lambda item: (STATUS_RANK[item[1].status], item[0])):
        if entry_id not in in_regime:
            continue
        reasons = [match.hardware_note, f"measured in the {regime} regime"]
        flags = _flags(match, gpu, arch, setting)
        on = f"SGLang {match.scope_sglang}" if match.scope_sglang else "its release"
        if match.status == "superseded":
            left_out.append(
                Suggestion(entry_id, match.title, [f"superseded on {on}: upstream already has it"], status="superseded")
            )
            continue
        if match.status == "verified":
            reasons.append(f"verified on {on}")
        elif verified_only:
            left_out.append(
                Suggestion(entry_id, match.title, [f"a candidate on {on}, and only verified entries were asked for"])
            )
            continue
        else:
            flags.append(f"a candidate on {on}, not verified: re-measure before relying on it")
        families = {drafter_family(d) for d in match.drafters}
        if family in families:
            reasons.append(f"measured with the {family} drafter family")
        else:
            flags.append(
                f"never measured with the {family} drafter family (measured with {', '.join(match.drafters) or 'no drafter'})"
            )
        if entry_id in same_model:
            reasons.append(f"measured on {model}")
        proposed[entry_id] = Suggestion(entry_id, match.title, reasons, flags, status=match.status)

    required = _requirements(con, sorted(proposed))
    pulled: dict[str, Suggestion] = {}
    for entry_id, needed_by in sorted(required.items()):
        if entry_id in proposed:
            proposed[entry_id].required_by = needed_by
            continue
        title, status = con.execute("SELECT title, status FROM entries WHERE id = ?", [entry_id]).fetchone()
        suggestion = Suggestion(
            entry_id, title, [f"required by {', '.join(needed_by)}"], required_by=needed_by, status=status
        )
        if status != "verified":
            suggestion.flags.append(
                f"a {status} entry, pulled in because {', '.join(needed_by)} need{'s' if len(needed_by) == 1 else ''} it"
            )
        match = matches.get(entry_id)
        if match is None:
            suggestion.flags.append(f"not validated on {hardware} on its own")
        else:
            suggestion.reasons.append(match.hardware_note)
            if entry_id not in in_regime:
                suggestion.flags.append(f"not measured in the {regime} regime")
            suggestion.flags.extend(_flags(match, gpu, arch, setting))
        pulled[entry_id] = suggestion
    picked = {*proposed, *pulled, *(s.id for s in left_out)}
    fits_hardware = {m.id for m in query_entries(con, QueryFilters(gpu=hardware))}
    for entry_id, title, status, validated in con.execute(
        "SELECT id, title, status, validated FROM entries ORDER BY id"
    ).fetchall():
        if entry_id in picked:
            continue
        if entry_id not in fits_hardware:
            why = f"no evidence on {hardware} or another {arch} GPU, and no variant built for {arch}"
        elif not validated:
            why = (
                "not validated: never timed end to end on real weights (a non-synthetic paired run), "
                "or a verdict rejected it"
            )
        else:
            why = f"never measured in the {regime} regime"
        left_out.append(Suggestion(entry_id, title, [why], status=status))
    return list(proposed.values()) + list(pulled.values()), left_out


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
