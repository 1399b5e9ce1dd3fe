"""The port check: the memory's entries onto another SGLang release, each with a verdict.

Each entry's chain (its requirements, then itself) is applied 3-way onto the release's import
(``store.releases``) by the resolver; an entry with a port for the release uses its ported delta. Per
entry the verdict is

- ``clean``: every file it touches is in the release as the entry recorded it (or a port applies);
- ``drift``: it applies, but files it touches changed upstream since it was recorded: the hunks matched
  the changed file, or a 3-way merge was needed (``touched`` hunks: upstream changed their lines or context);
- ``conflict``: some file does not apply (paths and hunks reported) — data, not an error;
- ``superseded``: the release already holds every change it makes;
- ``blocked``: a requirement conflicts or is blocked, so the entry cannot be applied there.

``port_entries`` writes a ported delta (``entries/<id>/ports/sglang-<release>.patch``) for entries whose
3-way merge is clean, recorded in the record's ``releases`` as a port that awaits re-validation.
``revalidate`` records every entry's verdict and status on the release and lists what must be re-measured.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path

from specpilot_mem.errors import SpecPilotError, UnknownEntryError
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord, Port, ReleaseCheck
from specpilot_mem.store.delta import Delta, FileChange, load_delta, parse_delta
from specpilot_mem.store.fork import Fork, open_fork
from specpilot_mem.store.records import (
    dump_record,
    entry_path,
    load_entries,
    write_atomic,
)
from specpilot_mem.store.releases import ReleaseBase, available_release, import_release, version_key
from specpilot_mem.store.resolver import (
    ALREADY_THERE,
    AS_RECORDED,
    BY_HUNKS,
    CONFLICT,
    EMPTY,
    FILE_CONFLICT,
    MERGED,
    PARTLY_THERE,
    PRESENT,
    REPLACED,
    Resolver,
)

PORTS_DIR = "ports"
_UPSTREAM_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


class PortError(SpecPilotError):
    """An entry that cannot be ported onto a release (conflict, blocked, already upstream)."""


@dataclass
class HunkReport:
    index: int  # 1-based, in the delta's order for the file
    old_start: int  # first line in the entry's pre-image
    old_lines: int
    new_lines: int
    touched: bool  # upstream changed lines the hunk removes or keeps as context
    first_change: str  # the first line the hunk adds or removes, for people

    @property
    def header(self) -> str:
        return f"@@ -{self.old_start},{self.old_lines} @@"


@dataclass
class FileReport:
    path: str
    how: str  # as recorded | hunks | merged | present | partly present | vendored copy replaced | conflict
    upstream: str  # unchanged | changed | missing (the release lacks the file) | exists (the entry adds it; the release has one)
    reason: str = ""
    hunks: list[HunkReport] = field(default_factory=list)


@dataclass
class EntryVerdict:
    id: str
    verdict: str
    files: list[FileReport]
    blocked_by: list[str] = field(default_factory=list)
    ported: bool = False  # checked with its port for this release
    tree: str | None = None  # the tree its chain gives on the release (None when it does not apply)
    port_reproduces: str | None = None

    @property
    def changed(self) -> list[str]:
        return [f.path for f in self.files if f.upstream != "unchanged"]

    @property
    def conflicts(self) -> list[str]:
        return [f.path for f in self.files if f.how == FILE_CONFLICT]

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "verdict": self.verdict,
            "blocked_by": self.blocked_by,
            "ported": self.ported,
            "tree": self.tree,
            "changed": self.changed,
            "conflicts": self.conflicts,
            "files": [
                {
                    "path": f.path,
                    "how": f.how,
                    "upstream": f.upstream,
                    "reason": f.reason,
                    "hunks": [
                        {
                            "index": h.index,
                            "header": h.header,
                            "old_start": h.old_start,
                            "touched": h.touched,
                            "first_change": h.first_change,
                        }
                        for h in f.hunks
                    ],
                }
                for f in self.files
            ],
        }


@dataclass
class ReleaseReport:
    release: ReleaseBase
    entries: list[EntryVerdict]

    def by_id(self) -> dict[str, EntryVerdict]:
        return {e.id: e for e in self.entries}

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for entry in self.entries:
            out[entry.verdict] = out.get(entry.verdict, 0) + 1
        return out


def port_path(home: Home, entry_id: str, release: str) -> Path:
    return home.entry_dir(entry_id) / PORTS_DIR / f"sglang-{release}.patch"


def release_resolver(
    fork: Fork, records: dict[str, EntryRecord], base: ReleaseBase, parsed: Resolver | None = None
) -> Resolver:
    """A resolver that applies each entry's port for ``base`` where it has one, else its recorded delta (the one
    ``parsed`` holds where given: a re-record's, before it is written)."""
    ports: dict[str, tuple[Delta, str]] = {}
    if not base.stock:
        for entry_id, record in records.items():
            check = record.release_check(base.version)
            if check and check.port and check.base == base.commit:
                path = fork.home.entry_dir(entry_id) / check.port.delta
                delta = load_delta(path, entry_id)
                if delta.sha256 != check.port.sha256:
                    raise PortError(
                        f"the port of {entry_id} to SGLang {base.version} has sha256 {delta.sha256}, "
                        f"the record says {check.port.sha256}",
                        where=str(path),
                        fix=f"restore it from git, or port it again: specpilot-mem port {entry_id} "
                        f"--onto sglang=={base.version}",
                    )
                ports[entry_id] = (delta, base.tree)
    return parsed.with_ports(records, ports) if parsed is not None else Resolver(fork, records, ports)


def _upstream_ranges(fork: Fork, pre: str, now: str) -> list[tuple[int, int]]:
    """Pre-image line ranges [start, end) that upstream changed (an insertion is an empty range at its place)."""
    text = fork.repo.git("diff", "--no-color", "--no-ext-diff", "-U0", pre, now).stdout.decode(errors="replace")
    ranges = []
    for line in text.splitlines():
        match = _UPSTREAM_HUNK.match(line)
        if match:
            start, count = int(match[1]), int(match[2] if match[2] is not None else 1)
            # "-a,0" is an insertion after line a: it touches the boundary between a and a+1
            ranges.append((start + 1, start + 1) if count == 0 else (start, start + count))
    return ranges


def _hunk_reports(change: FileChange, ranges: list[tuple[int, int]]) -> list[HunkReport]:
    reports = []
    for n, hunk in enumerate(change.hunks, 1):
        start, end = hunk.old_start, hunk.old_start + len(hunk.before)
        touched = any(lo < end and hi > start if hi > lo else start < lo < end for lo, hi in ranges)
        removed = [line for line in hunk.before if line not in hunk.after]
        added = [line for line in hunk.after if line not in hunk.before]
        first = (removed or added or [b""])[0].decode(errors="replace").strip()[:100]
        reports.append(HunkReport(n, hunk.old_start, len(hunk.before), len(hunk.after), touched, first))
    return reports


def _file_reports(
    fork: Fork, resolver: Resolver, base: ReleaseBase, chain: list[str], files: dict[str, str]
) -> list[FileReport]:
    """What happened to each file of the last entry of ``chain``, and how upstream changed it."""
    entry_id = chain[-1]
    before = resolver.walk(base.tree, chain[:-1]).overlay
    tree = resolver.base(base.tree).files
    prefix = fork.package_prefix
    reports = []
    for change in resolver.delta(entry_id).changes:
        path = prefix + change.path
        now = before[path] if path in before else tree.get(path)
        pre = None if change.added else (change.old_mode, change.old_oid)
        how = files.get(change.path, FILE_CONFLICT)
        report = FileReport(change.path, how, "unchanged")
        if how == REPLACED:  # an earlier entry's vendored copy, not upstream's file
            report.reason = "a vendored kernel copy: it replaces the copy an entry before it vendored"
            if path in tree:
                report.upstream = "exists"
        elif now != pre and not change.mode_only:
            if now is None:
                report.upstream, report.reason = "missing", "the release has no such file"
            elif pre is None:
                report.upstream, report.reason = "exists", "the entry adds this file, and the release already has one"
            else:
                report.upstream = "changed"
                if change.binary:
                    report.reason = "a binary file the release changed"
                else:
                    report.hunks = _hunk_reports(change, _upstream_ranges(fork, pre[1], now[1]))
                    touched = [h.index for h in report.hunks if h.touched]
                    if how == FILE_CONFLICT:
                        report.reason = (
                            f"upstream changed the lines of hunk{'s' if len(touched) > 1 else ''} "
                            f"{', '.join(map(str, touched))} differently"
                            if touched
                            else "the hunks do not apply and the 3-way merge conflicts"
                        )
                    elif how == ALREADY_THERE:
                        report.reason = "the release already makes this change"
                    elif how == PARTLY_THERE:
                        report.reason = "the release already makes part of this change"
                    elif touched:
                        report.reason = (
                            f"upstream changed lines in or beside hunk{'s' if len(touched) > 1 else ''} "
                            f"{', '.join(map(str, touched))}; merged 3-way"
                        )
                    else:
                        report.reason = "upstream changed the file away from the entry's lines"
        reports.append(report)
    return reports


def _verdict(status: str, files: list[FileReport], blocked_by: list[str]) -> str:
    if status == CONFLICT:
        return "conflict"
    if blocked_by:
        return "blocked"
    if status == PRESENT:
        return "superseded"
    if status == EMPTY or all(f.how == AS_RECORDED for f in files):
        return "clean"
    if any(f.how in (BY_HUNKS, MERGED, ALREADY_THERE, PARTLY_THERE) for f in files):
        return "drift"
    return "clean"


def check_entries(fork: Fork, resolver: Resolver, base: ReleaseBase, ids: list[str]) -> list[EntryVerdict]:
    """The verdict of every entry of ``ids`` (requirement-closed, in order) on ``base``."""
    verdicts: dict[str, EntryVerdict] = {}
    for entry_id in ids:
        chain = resolver.chain([entry_id])
        walk = resolver.walk(base.tree, chain)
        outcome = walk.outcomes[-1]
        blocked = sorted(r for r in chain[:-1] if verdicts[r].verdict in ("conflict", "blocked"))
        files = _file_reports(fork, resolver, base, chain, outcome.files)
        verdict = EntryVerdict(
            entry_id, _verdict(outcome.status, files, blocked), files, blocked, ported=entry_id in resolver.ports
        )
        if verdict.verdict not in ("conflict", "blocked"):
            verdict.tree = resolver.tree_id(base.tree, walk)
        verdicts[entry_id] = verdict
    return [verdicts[i] for i in ids]


def check_release(home: Home, spec: str, ids: list[str] | None = None, progress=None) -> ReleaseReport:
    """Import the release ``spec`` names if needed and give every entry's verdict there (all entries by default)."""
    records = load_entries(home)
    fork = open_fork(home)
    with fork.lock():
        resolver = Resolver(fork, records)
        order = resolver.chain(ids if ids else records)  # unknown ids and broken requirements stop here
        base = import_release(fork, spec, progress)
        resolver = release_resolver(fork, records, base)
        return ReleaseReport(base, check_entries(fork, resolver, base, order))


def _check_record(
    verdict: EntryVerdict, base: ReleaseBase, status: str, today: dt.date, port: Port | None
) -> ReleaseCheck:
    return ReleaseCheck(
        release=base.version,
        status=status,
        verdict=verdict.verdict,
        base=base.commit,
        checked=today,
        changed=verdict.changed,
        conflicts=verdict.conflicts,
        blocked_by=verdict.blocked_by,
        port=port,
    )


def _with_check(record: EntryRecord, check: ReleaseCheck) -> EntryRecord:
    """``record`` with its check for the release replaced; a check equal but for the date keeps the old date."""
    old = record.release_check(check.release)
    if old is not None and old.model_copy(update={"checked": check.checked}) == check:
        return record
    releases = [r for r in record.releases if r.release != check.release] + [check]
    releases.sort(key=lambda r: version_key(r.release))
    return record.model_copy(update={"releases": releases})


def port_entries(
    home: Home, ids: list[str], spec: str, today: dt.date | None = None
) -> tuple[ReleaseBase, list[EntryVerdict]]:
    """Write a ported delta for each of ``ids`` onto the release; all must merge cleanly, else nothing is written."""
    today = today or dt.datetime.now(dt.UTC).date()
    records = load_entries(home)
    for entry_id in ids:
        if entry_id not in records:
            raise UnknownEntryError(
                f"unknown entry {entry_id!r}",
                where=str(home.entries),
                fix="known entries: " + (", ".join(sorted(records)) or "(none yet)"),
            )
    fork = open_fork(home)
    with fork.lock():
        order = Resolver(fork, records).chain(ids)
        base = import_release(fork, spec)
        if base.stock:
            raise PortError(
                f"SGLang {base.version} is this memory's stock: its entries are recorded against it",
                where="--onto",
                fix="port onto another release, e.g. --onto sglang==0.5.20",
            )
        resolver = release_resolver(fork, records, base)
        verdicts = {v.id: v for v in check_entries(fork, resolver, base, order)}
        wanted = [i for i in order if i in ids]
        refused = [verdicts[i] for i in wanted if verdicts[i].verdict in ("conflict", "blocked", "superseded")]
        if refused:

            def why(v: EntryVerdict) -> str:
                if v.verdict == "conflict":
                    return f"{v.id} conflicts in {', '.join(v.conflicts)}"
                if v.verdict == "blocked":
                    return f"{v.id} is blocked by {', '.join(v.blocked_by)}"
                return f"{v.id} is already upstream (superseded): there is nothing to port"

            raise PortError(
                "; ".join(why(v) for v in refused),
                where=f"--onto sglang=={base.version}",
                fix="only entries whose 3-way merge is clean are ported; see `specpilot-mem apply "
                f"{' '.join(wanted)} --onto sglang=={base.version}` for the paths and hunks",
            )
        writes: list[tuple[Path, bytes | str]] = []
        ported = []
        from specpilot_mem.store.record import (
            _diff as tree_delta,  # the diff record_entry writes
        )

        for entry_id in wanted:
            record, verdict = records[entry_id], verdicts[entry_id]
            if verdict.ported:  # already ported: the port applies as recorded
                ported.append(verdict)
                continue
            base_tree = resolver.tree_id(
                base.tree, resolver.walk(base.tree, resolver.chain(record.requires)), write=True
            )
            walk = resolver.walk(base.tree, resolver.chain([entry_id]))
            result_tree = resolver.tree_id(base.tree, walk, write=True)
            path = port_path(home, entry_id, base.version)
            text = tree_delta(fork, base_tree, result_tree)
            delta = parse_delta(text, entry_id, str(path))
            port = Port(
                source=record.scope.sglang or _stock_version(),
                delta=path.relative_to(home.entry_dir(entry_id)).as_posix(),
                sha256=delta.sha256,
                reproduces=result_tree,
                ported=today,
            )
            # the port must give the same tree when applied as a port (proved before anything is written)
            trial = Resolver(fork, records, {**resolver.ports, entry_id: (delta, base.tree)})
            trial.ensure_ready(entry_id)
            got = trial.tree_id(base.tree, trial.walk(base.tree, trial.chain([entry_id])))
            if got != result_tree:
                raise PortError(
                    f"the ported delta of {entry_id} gives {got}, not the merged tree {result_tree}",
                    where=str(path),
                    fix="report this: the store could not reproduce its own diff",
                )
            check = _check_record(verdict, base, "candidate", today, port)
            records[entry_id] = _with_check(record, check)
            writes += [(path, text), (entry_path(home, entry_id), dump_record(records[entry_id]))]
            verdict.port_reproduces = result_tree
            ported.append(verdict)
        for path, payload in writes:
            write_atomic(path, payload)
        return base, ported


def _stock_version() -> str:
    from specpilot_mem.store.stock import SGLANG_VERSION

    return SGLANG_VERSION


# --------------------------------------------------------------------------------------------- revalidate

ACTIONS = {
    "clean": "none: the code it touches is unchanged",
    "drift": "re-measure on the release",
    "conflict": "re-record it on the release (the conflicts are listed), then re-measure",
    "blocked": "port its requirements first",
    "superseded": "none: upstream has it; drop it when moving to this release",
}


@dataclass
class Revalidation:
    id: str
    verdict: EntryVerdict
    before: str | None  # status on the release before (None: never checked)
    after: str
    action: str
    remeasure: list[dict]

    @property
    def demoted(self) -> bool:
        return self.before == "verified" and self.after != "verified"


def remeasure_plan(record: EntryRecord) -> list[dict]:
    """Where the entry must be measured again: one item per distinct setting of its evidence (the GPU, arch,
    target, drafter, regime and the command), else the arches of its variants, else any GPU."""
    seen, items = set(), []
    for ev in record.evidence:
        dep = ev.deployment
        key = (dep.gpu, dep.arch, dep.target, dep.drafter, dep.regime, ev.command)
        if key not in seen:
            seen.add(key)
            items.append(
                {
                    "gpu": dep.gpu,
                    "arch": dep.arch,
                    "target": dep.target,
                    "drafter": dep.drafter,
                    "regime": dep.regime,
                    "kind": ev.kind,
                    "command": ev.command,
                }
            )
    if not items:
        arches = sorted({a for v in record.variants for a in v.hardware}) or ["any"]
        items = [
            {
                "gpu": None,
                "arch": a,
                "target": None,
                "drafter": None,
                "regime": None,
                "kind": "contract",
                "command": "; ".join(record.contract.commands) or None,
            }
            for a in arches
        ]
    return items


def revalidate(
    home: Home, spec: str, today: dt.date | None = None, dry_run: bool = False
) -> tuple[ReleaseBase, list[Revalidation]]:
    """Run the port check for every entry on the release, record each one's verdict and status there, and
    demote what the check cannot confirm to ``candidate``. Records are written at the end, all checks done."""
    today = today or dt.datetime.now(dt.UTC).date()
    records = load_entries(home)
    fork = open_fork(home)
    with fork.lock():
        order = Resolver(fork, records).chain(records)
        base = import_release(fork, spec)
        results, updated = _revalidated(fork, records, base, order, today)
        if not dry_run:
            for entry_id, record in updated.items():
                write_atomic(entry_path(home, entry_id), dump_record(EntryRecord.model_validate(record.model_dump())))
        return base, results


def _revalidated(
    fork: Fork,
    records: dict[str, EntryRecord],
    base: ReleaseBase,
    order: list[str],
    today: dt.date,
    parsed: Resolver | None = None,
) -> tuple[list[Revalidation], dict[str, EntryRecord]]:
    """The port check of ``order`` (requirement-closed, in order) on ``base`` and what it makes of each entry's
    status there: (one ``Revalidation`` per entry, {id: record with its new check or status} where it changed).
    ``parsed``: the resolver whose deltas to check (``release_resolver``)."""
    resolver = release_resolver(fork, records, base, parsed)
    verdicts = check_entries(fork, resolver, base, order)
    if base.stock:  # the release the entries were recorded on: they must reproduce there
        for verdict in verdicts:
            if verdict.verdict == "clean" and verdict.tree != records[verdict.id].reproduces:
                verdict.verdict = "drift"
    results, updated, statuses = [], {}, {}
    for verdict in verdicts:
        record = records[verdict.id]
        own = base.version == (record.scope.sglang or _stock_version())  # the release its status is about
        old = None if own else record.release_check(base.version)
        before = record.status if own else (old.status if old else None)
        action = ACTIONS[verdict.verdict]
        same = old is not None and (old.base, old.verdict, old.changed) == (
            base.commit,
            verdict.verdict,
            verdict.changed,
        )
        if verdict.verdict == "superseded":
            after = "superseded"
        elif verdict.verdict == "drift" and same:
            after = old.status  # the same merge as last time: a confirmation after re-measuring stands
            action = "none: confirmed on this release" if after == "verified" else action
        elif verdict.verdict != "clean":
            after = "candidate"
        elif own and verdict.tree != record.reproduces:
            after, action = "candidate", "it does not reproduce its record here: run `specpilot-mem verify`"
        elif verdict.ported and old is not None:
            after = old.status  # a port stays candidate until it is re-measured and confirmed
            action = "none" if after == "verified" else "re-measure the port on the release"
        else:
            after = record.status  # unchanged code keeps the entry's own status
        unconfirmed = [r for r in record.requires if statuses.get(r) != "verified"]
        if after == "verified" and unconfirmed:  # its chain runs their code too
            after = "candidate"
            action = (
                f"re-measure once {', '.join(unconfirmed)} {'is' if len(unconfirmed) == 1 else 'are'} confirmed here"
            )
        statuses[verdict.id] = after
        if own:
            new = record.model_copy(update={"status": after})
        else:
            new = _with_check(record, _check_record(verdict, base, after, today, old.port if verdict.ported else None))
        if new != record:
            updated[verdict.id] = new
        needs = after == "candidate"
        results.append(
            Revalidation(verdict.id, verdict, before, after, action, remeasure_plan(record) if needs else [])
        )
    return results, updated


def recheck_releases(resolver: Resolver, ids: list[str], today: dt.date) -> dict[str, EntryRecord]:
    """Run again, as ``revalidate`` would, the release checks that the entries ``ids`` hold, on the records and
    deltas of ``resolver`` (a re-record's, not yet written: each record still holds its old checks, a changed
    delta's ports taken out).

    A pinned release is imported if needed (``releases.available_release``); where that fails (no wheel and no
    network) or another release's import is gone, the entries' checks on it are dropped, to be re-run with
    ``revalidate``. The caller holds the fork's lock. Returns the records with the checks of ``ids`` renewed."""
    fork, records = resolver.fork, dict(resolver.records)
    versions = sorted({c.release for i in ids for c in records[i].releases}, key=version_key)
    order = resolver.chain(ids)
    for version in versions:
        holders = [i for i in ids if records[i].release_check(version) is not None]
        try:
            base = available_release(fork, version)
        except SpecPilotError:
            base = None
        if base is None:
            for entry_id in holders:
                kept = [c for c in records[entry_id].releases if c.release != version]
                records[entry_id] = records[entry_id].model_copy(update={"releases": kept})
            continue
        _results, updated = _revalidated(fork, records, base, order, today, resolver)
        records.update({i: updated[i] for i in holders if i in updated})
    return records


def set_status(home: Home, entry_id: str, status: str, release: str | None = None) -> EntryRecord:
    """Set an entry's status by hand (e.g. ``verified`` once re-measured): on its own release, or on
    ``release``, where it must have been checked (``revalidate``) and apply (clean, drift, or a port)."""
    records = load_entries(home)
    if entry_id not in records:
        raise UnknownEntryError(
            f"unknown entry {entry_id!r}",
            where=str(home.entries),
            fix="known entries: " + (", ".join(sorted(records)) or "(none yet)"),
        )
    record = records[entry_id]
    fork = open_fork(home)
    with fork.lock():
        if release is None or release == record.scope.sglang:
            new = record.model_copy(update={"status": status})
        else:
            check = record.release_check(release)
            if check is None:
                raise PortError(
                    f"{entry_id} was never checked on SGLang {release}",
                    where=f"entries/{entry_id}/entry.yaml",
                    fix=f"run `specpilot-mem revalidate --release {release}` first",
                )
            if status == "verified" and check.verdict not in ("clean", "drift"):
                raise PortError(
                    f"{entry_id} does not apply on SGLang {release} ({check.verdict}), so it cannot be verified there",
                    where=f"entries/{entry_id}/entry.yaml",
                    fix=f"re-record it on the release or port its requirements first (`specpilot-mem port ... --onto sglang=={release}`)",
                )
            new = _with_check(record, check.model_copy(update={"status": status}))
        from specpilot_mem.store.records import validate_data

        new = validate_data(new.model_dump(), EntryRecord, f"entries/{entry_id}/entry.yaml")
        write_atomic(entry_path(home, entry_id), dump_record(new))
        return new
