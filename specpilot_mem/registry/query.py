"""Finding entries for a setting: ``specpilot-mem query`` and the candidates of ``deploy new --suggest``.

An evidence row *fits* a query when its target, drafter and regime match the ones asked for (names match
ignoring case and punctuation, as substrings: ``--drafter eagle`` finds EAGLE-3). An entry matches a GPU or
arch when a fitting evidence row was measured on that arch, or when it has a variant built for the arch;
each match says which of the three it is:

- ``gpu``: measured on that very GPU;
- ``arch``: measured on another GPU of the same arch (H100 and H200 are both sm_90);
- ``variant``: a variant is built for the arch but no fitting evidence was measured on it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    from specpilot_mem.models import Regime

from specpilot_mem.errors import RegistryError, UnknownEntryError
from specpilot_mem.gpus import GPU, resolve_gpu_or_arch
from specpilot_mem.gpus import name_key  # the GPU table's name matching, reused for models and drafters

HARDWARE_RANK = {"gpu": 0, "arch": 1, "variant": 2, None: 3}
STATUS_RANK = {"verified": 0, "candidate": 1, "unchecked": 2, "superseded": 3}


@dataclass(frozen=True)
class QueryFilters:
    gpu: str | None = None  # a GPU name or an arch id
    arch: str | None = None
    model: str | None = None
    drafter: str | None = None
    regime: Regime | None = None
    requires: str | None = None  # entries whose requirement closure holds this id
    text: str | None = None  # every word must appear in the title, summary or limits
    validated_only: bool = False
    status: str | None = None  # verified | candidate | superseded (| unchecked, with release)
    release: str | None = None  # the SGLang release the status is asked on (default: each entry's own)

    def hardware(self) -> tuple[GPU | None, str | None]:
        """The GPU (if a GPU name was given) and the arch the query is about."""
        gpu, arch = resolve_gpu_or_arch(self.gpu) if self.gpu else (None, None)
        if self.arch:
            if not self.arch.strip().lower().startswith("sm_"):
                raise RegistryError(
                    f"--arch takes an arch id, not {self.arch!r}",
                    where="--arch",
                    fix="pass an arch id such as sm_90, or the GPU name with --gpu",
                )
            _, only_arch = resolve_gpu_or_arch(self.arch)
            if arch is not None and arch != only_arch:
                raise RegistryError(
                    f"--gpu {self.gpu} is {arch}, which contradicts --arch {only_arch}",
                    where="--gpu/--arch",
                    fix="drop one of them, or make them agree",
                )
            arch = only_arch
        return gpu, arch


@dataclass
class EvidenceHit:
    """The best fitting evidence of an entry: on the queried GPU, then its arch, then end-to-end, real, recent."""

    kind: str
    gpu: str
    arch: str
    target: str | None
    drafter: str | None
    regime: str | None
    batch_sizes: list[int]
    verdict: str | None
    synthetic: bool
    date: str
    figure: dict | None  # the evidence's first figure: name, value, unit, ci_low, ci_high

    def headline(self) -> str:
        if self.figure is None:
            return self.kind
        fig = self.figure
        ci = (
            f" [{fig['ci_low']:g}, {fig['ci_high']:g}]"
            if fig["ci_low"] is not None and fig["ci_high"] is not None
            else ""
        )
        return f"{fig['name']} {fig['value']:g}{fig['unit']}{ci}"


@dataclass
class EntryMatch:
    id: str
    title: str
    summary: str
    validated: bool
    status: str  # on the entry's own release (scope_sglang)
    scope_sglang: str | None
    release_status: str  # on the queried release (its own status when none was named); "unchecked" where never checked
    releases: list[dict]  # every other release it was checked on: release, status, verdict, ported
    requires: list[str]
    hardware: str | None  # gpu | arch | variant; None when the query named no hardware
    hardware_note: str
    best: EvidenceHit | None
    measured_on: list[str]  # GPUs of the fitting evidence
    regimes: list[str]  # regimes of the fitting evidence
    drafters: list[str]
    evidence_count: int  # fitting evidence rows
    untested: list[
        dict
    ]  # each with 'relevant': the query's regime/arch/GPU/drafter/model is one the entry never ran in

    @property
    def flagged(self) -> list[dict]:
        return [u for u in self.untested if u["relevant"]]


def known_entry_ids(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {row[0] for row in con.execute("SELECT id FROM entries").fetchall()}


def require_known(con: duckdb.DuckDBPyConnection, ids: list[str], where: str) -> None:
    known = known_entry_ids(con)
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise UnknownEntryError(
            f"unknown entr{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)}",
            where=where,
            fix="list the entries with `specpilot-mem query` (the registry indexes entries/<id>/entry.yaml)",
        )


def query_entries(con: duckdb.DuckDBPyConnection, filters: QueryFilters) -> list[EntryMatch]:
    """Entries matching ``filters``, best hardware match first.

    DuckDB selects the entries and their fitting evidence in one statement; what the result shows of each
    entry comes from its card (prepared at sync time), because on a registry this size every further
    statement or joined row costs more than the Python that reads the cards.
    """
    gpu, arch = filters.hardware()
    if filters.requires:
        require_known(con, [filters.requires], "--requires")
    params: dict = {
        "model": _key(filters.model),
        "drafter": _key(filters.drafter),
        "regime": filters.regime,
        "arch": arch,
    }
    setting_given = any((filters.model, filters.drafter, filters.regime))
    where: list[str] = []
    if arch is not None:
        variant_match = "id IN (SELECT entry_id FROM variants WHERE list_contains(hardware, $arch))"
        if setting_given:
            variant_match += " AND id IN (SELECT entry_id FROM fit)"
        where.append(f"(id IN (SELECT entry_id FROM fit WHERE arch = $arch) OR ({variant_match}))")
    elif setting_given:
        where.append("id IN (SELECT entry_id FROM fit)")
    words = list(dict.fromkeys((filters.text or "").lower().split()))  # one condition, however many words
    if words:
        params["words"] = words
        where.append("len(list_filter($words, lambda word: NOT contains(search_text, word))) = 0")
    if filters.validated_only:
        where.append("validated")
    if filters.status:
        if filters.status not in STATUSES:
            raise RegistryError(
                f"--status {filters.status!r} is not a status",
                where="--status",
                fix=f"pass one of {', '.join(STATUSES)}",
            )
        if filters.status == "unchecked" and not filters.release:
            raise RegistryError(
                "--status unchecked needs --release",
                where="--status",
                fix="name the release, e.g. --release 0.5.20 --status unchecked",
            )
        params["status"] = filters.status
        where.append("release_status = $status")
    if filters.requires:
        params["requires"] = filters.requires
        where.append("id IN (SELECT entry_id FROM closure WHERE req = $requires)")
    if filters.release:
        from specpilot_mem.models import RELEASE  # here: the record models cost more than the rest of a query

        if not re.match(RELEASE, filters.release):
            raise RegistryError(
                f"--release {filters.release!r} is not an SGLang version",
                where="--release",
                fix="pass a version such as 0.5.20",
            )
    params["release"] = filters.release
    sql = MATCH_SQL.format(closure=REQUIREMENT_CLOSURE if filters.requires else "", where=" AND ".join(where) or "true")
    rows = con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql}).fetchall()
    matches = [_match(row, gpu, arch, filters) for row in rows]
    matches.sort(key=lambda m: (HARDWARE_RANK[m.hardware], STATUS_RANK[m.release_status], not m.validated, m.id))
    return matches


REQUIREMENT_CLOSURE = """
    closure(entry_id, req) AS (
        SELECT entry_id, requires_id FROM requirements
        UNION
        SELECT c.entry_id, r.requires_id FROM closure c JOIN requirements r ON r.entry_id = c.req),"""

MATCH_SQL = """
WITH RECURSIVE {closure}
fit AS (
    SELECT entry_id, idx, arch FROM evidence
    WHERE (CAST($model AS VARCHAR) IS NULL OR contains(target_key, $model))
      AND (CAST($drafter AS VARCHAR) IS NULL OR contains(drafter_key, $drafter))
      AND (CAST($regime AS VARCHAR) IS NULL OR regime = $regime)),
fit_idx AS (SELECT entry_id, list(idx) AS idx FROM fit GROUP BY entry_id),
on_release AS (SELECT entry_id, status FROM releases WHERE release = CAST($release AS VARCHAR)),
ranked AS (
    SELECT entries.*, fit_idx.idx AS fit, CASE
        WHEN CAST($release AS VARCHAR) IS NULL OR scope_sglang = $release THEN entries.status
        ELSE coalesce(on_release.status, 'unchecked') END AS release_status
    FROM entries LEFT JOIN fit_idx ON fit_idx.entry_id = entries.id LEFT JOIN on_release ON on_release.entry_id = entries.id)
SELECT id, title, summary, validated, card, fit, release_status
FROM ranked
WHERE {where}
"""
STATUSES = ("verified", "candidate", "superseded", "unchecked")


def _key(text: str | None) -> str | None:
    return name_key(text) if text else None


def _match(row: tuple, gpu: GPU | None, arch: str | None, filters: QueryFilters) -> EntryMatch:
    entry_id, title, summary, validated, card_json, fit_idx, release_status = row
    card = json.loads(card_json)
    fitting = set(fit_idx or ())
    fit = [e for e in card["evidence"] if e["idx"] in fitting]
    on_arch = [e for e in fit if e["arch"] == arch]
    on_gpu = [e for e in on_arch if gpu is not None and e["gpu_name"] == gpu.name]
    if arch is None:
        hardware, note, pool = None, "", fit
    elif on_gpu:
        hardware, note, pool = "gpu", f"measured on {gpu.name}", on_gpu
    elif on_arch:
        gpus = ", ".join(sorted({e["gpu"] for e in on_arch}))
        hardware, note, pool = "arch", f"measured on {gpus} ({arch})" + (f", not on {gpu.name}" if gpu else ""), on_arch
    else:
        names = ", ".join(v["name"] for v in card["variants"] if arch in v["hardware"])
        ran = any(e["arch"] == arch for e in card["evidence"])
        hardware, pool = "variant", fit
        note = f"variant {names} built for {arch}, " + ("not run on it in this setting" if ran else "never run on it")
    best = max(pool, key=lambda e: (e["kind"] == "paired-run", not e["synthetic"], e["date"], -e["idx"]), default=None)
    return EntryMatch(
        id=entry_id,
        title=title,
        summary=summary,
        validated=validated,
        status=card["status"],
        scope_sglang=card["scope"]["sglang"],
        release_status=release_status,
        releases=card["releases"],
        requires=card["requires"],
        hardware=hardware,
        hardware_note=note,
        best=None
        if best is None
        else EvidenceHit(
            best["kind"],
            best["gpu"],
            best["arch"],
            best["target"],
            best["drafter"],
            best["regime"],
            best["batch_sizes"],
            best["verdict"],
            best["synthetic"],
            best["date"],
            best["figure"],
        ),
        measured_on=sorted({e["gpu"] for e in fit}),
        regimes=sorted({e["regime"] for e in fit if e["regime"]}),
        drafters=sorted({e["drafter"] for e in fit if e["drafter"]}),
        evidence_count=len(fit),
        untested=[{**u, "relevant": untested_relevant(u, gpu, arch, filters)} for u in card["untested"]],
    )


def untested_relevant(untested: dict, gpu: GPU | None, arch: str | None, filters: QueryFilters) -> bool:
    """Whether an untested item names the regime, arch, GPU, drafter or model the query asks about."""
    return bool(
        (filters.regime and untested["regime"] == filters.regime)
        or (arch and untested["arch"] == arch)
        or (gpu and untested["gpu"] and name_key(untested["gpu"]) in {name_key(n) for n in (gpu.name, *gpu.aliases)})
        or (filters.drafter and untested["drafter"] and name_key(filters.drafter) in name_key(untested["drafter"]))
        or (filters.model and untested["model"] and name_key(filters.model) in name_key(untested["model"]))
    )
