"""Recording and updating entries: what distillation after a round calls.

``record_entry`` turns a fork commit or a work tree built on an entry's requirements into an entry:
the delta (base -> source), the record (``reproduces`` = the source's tree) and the branch;
``record_sources`` does the same from entries' sources (``store.sources``), for one entry or several at once.
Re-recording an entry that others require rebases them (TopGit's ``tg update``): each dependent, in
requirement order, is re-recorded 3-way onto its new base, its evidence kept and marked for re-validation,
and its sources re-rendered (so its patches follow the new base and no copy goes stale); a conflict in any
of them changes nothing and names each conflicting file with the fix (resolve it in the dependent's
sources and record both together). The checks on other SGLang releases that the entry and its dependents hold
are run again on the new records (``port.recheck_releases``), so a re-record keeps them current. Other updates
(a variant, evidence) re-verify every entry that requires it. All checks run first; then the files are
replaced atomically and the refs move in one transaction.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from specpilot_mem.errors import (
    ConflictError,
    DeltaError,
    RecordError,
    ReproductionError,
    RequirementError,
    SpecPilotError,
)
from specpilot_mem.git import Repo
from specpilot_mem.home import Home
from specpilot_mem.models import ENTRY_ID, EntryRecord, Evidence, Variant
from specpilot_mem.store.branches import sync_branches
from specpilot_mem.store.delta import parse_delta
from specpilot_mem.store.fork import Fork, open_fork
from specpilot_mem.store.kernels import VENDOR_DIR, vendored_sources
from specpilot_mem.store.port import recheck_releases
from specpilot_mem.store.records import (
    delta_path,
    dump_record,
    entry_path,
    load_entries,
    load_record_file,
    validate_data,
    write_atomic,
)
from specpilot_mem.store.requirements import closure
from specpilot_mem.store.resolver import CONFLICT, Resolver, check_symlinks
from specpilot_mem.store.sources import SRC, has_sources, read_sources, render_sources, sources_tree, write_sources

# Fields the store fills in; a draft may not set them.
_STORE_FIELDS = ("id", "requires", "reproduces", "kernels", "recorded", "releases")


def snapshot_tree(fork: Fork, source: str) -> tuple[str, str | None]:
    """(tree id, commit id or None) of ``source``: a fork revision, or a work tree of the fork
    (uncommitted and untracked files included, ignored files left out)."""
    path = Path(source).expanduser()
    if path.is_dir():
        target = Repo(path.resolve())
        if not target.exists() or target.common_dir.resolve() != fork.repo.common_dir.resolve():
            raise SpecPilotError(
                f"{path} is not a work tree of the fork",
                where="--from",
                fix=f"pass a fork revision, or a worktree made with `git -C {fork.repo.path} worktree add`",
            )
        with target.temporary_index() as env:
            real_index = target.git_dir / "index"
            if real_index.exists():
                shutil.copyfile(real_index, env["GIT_INDEX_FILE"])
            else:
                target.git("read-tree", "HEAD", env=env)
            target.git("add", "--all", "--", ".", env=env)
            return target.out("write-tree", env=env), None
    commit = fork.repo.rev_parse(f"{source}^{{commit}}")
    if commit is None:
        raise SpecPilotError(
            f"the fork has no revision {source!r} and there is no such folder",
            where="--from",
            fix="pass a branch, tag or commit of sglang-fork, or a worktree path",
        )
    return fork.repo.rev_parse(f"{commit}^{{tree}}"), commit


def _diff(fork: Fork, base_tree: str, source_tree: str) -> bytes:
    prefix = fork.package_prefix
    if prefix:
        outside = fork.repo.out("diff-tree", "-r", "--name-only", "--no-renames", base_tree, source_tree)
        stray = [p for p in outside.splitlines() if not p.startswith(prefix)]
        if stray:
            raise DeltaError(
                f"the source changes files outside {prefix}: {', '.join(stray[:5])}",
                where="--from",
                fix=f"entries change only the SGLang package under {prefix}; move those changes out",
            )
    args = [
        "diff-tree",
        "-r",
        "-p",
        "--binary",
        "--full-index",
        "--no-renames",
        "--no-color",
        "--no-ext-diff",
        "--no-textconv",
        "--src-prefix=a/",
        "--dst-prefix=b/",
    ]
    if prefix:
        args.append(f"--relative={prefix}")
    return fork.repo.git(*args, base_tree, source_tree).stdout


def _kernel_pins(fork: Fork, source_tree: str, delta) -> dict[str, str]:
    """sha256 of every vendored kernel file the delta adds or changes."""
    vendored = [
        c
        for c in delta.changes
        if c.path.startswith(VENDOR_DIR + "/") and not c.deleted and not c.path.endswith("/__init__.py")
    ]
    blobs = fork.repo.read_blobs(c.new_oid for c in vendored if c.new_oid)
    pins = {}
    for change in vendored:
        oid = change.new_oid or fork.repo.rev_parse(f"{source_tree}:{fork.package_prefix}{change.path}")
        content = blobs.get(oid) if oid in blobs else fork.repo.read_blobs([oid])[oid]
        pins[change.path] = hashlib.sha256(content).hexdigest()
    return pins


def _check_built_on_requirements(fork: Fork, resolver: Resolver, base_walk, source_tree: str, source: str) -> None:
    """A source that has stock's version of a file its requirements changed was not built on them;
    recording it would make the entry undo them."""
    changed = sorted(base_walk.overlay)
    if not changed:
        return
    stock = resolver.base(fork.stock_tree).files
    raw = fork.repo.git("ls-tree", "-z", "--full-tree", source_tree, "--", *changed).stdout
    in_source = {}
    for item in raw.split(b"\0"):
        if item:
            meta, path = item.split(b"\t", 1)
            mode, _kind, oid = meta.decode().split()
            in_source[path.decode()] = (mode, oid)
    undone = [p for p in changed if in_source.get(p) == stock.get(p) and in_source.get(p) != base_walk.overlay[p]]
    if undone:
        owners = sorted({e for p in undone for e in base_walk.touched.get(p, [])})
        raise DeltaError(
            f"{source} is not built on its requirements: it has stock's version of {', '.join(undone[:5])}, "
            f"which {', '.join(owners)} changed",
            where="--from",
            fix="start the work from `specpilot-mem apply <requirements> --worktree PATH` (or the entry/<id> branch)",
        )


def _draft(meta: str | Path | dict | None) -> tuple[dict[str, Any], str | None]:
    """The draft's fields and its YAML text (for line numbers in validation errors)."""
    if meta is None:
        return {}, None
    text = None
    if isinstance(meta, dict):
        data = dict(meta)
    else:
        path = Path(meta)
        try:
            text = path.read_text()
            data = yaml.safe_load(text) or {}
        except FileNotFoundError:
            raise RecordError(
                f"no draft record at {path}",
                where="--meta",
                fix="check the path; `specpilot-mem schema entry` prints a draft's fields",
            ) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            raise RecordError(
                f"malformed YAML: {getattr(err, 'problem', err)}",
                where=f"{path}:{mark.line + 1 if mark else 1}",
                fix="fix the YAML syntax",
            ) from None
        if not isinstance(data, dict):
            raise RecordError(
                "a draft record must be a YAML mapping",
                where=f"{path}:1",
                fix="write it as `field: value` lines (title, summary, contract, ...)",
            )
    bad = [k for k in _STORE_FIELDS if k in data and k != "id"]
    if bad:
        raise RecordError(
            f"the draft sets {', '.join(bad)}, which record fills in",
            where=str(meta),
            fix="leave them out (use --requires for requirements)",
        )
    return data, text


BASE_CHANGED = "base changed: re-validate"


def _drop_ports(fields: dict) -> None:
    """A new delta's release checks: kept, to be run again (``recheck_releases``), without the ports, which
    were of the old delta (``specpilot-mem port`` makes new ones)."""
    if fields.get("releases"):
        fields["releases"] = [{k: v for k, v in check.items() if k != "port"} for check in fields["releases"]]


def _rebase_dependents(
    fork: Fork, resolver: Resolver, entry_id: str, today: dt.date, skip: set[str]
) -> tuple[Resolver, dict[str, tuple[EntryRecord, bytes]]]:
    """Re-record every entry that requires ``entry_id`` (whose record and delta ``resolver`` already holds)
    onto its new base, in requirement order: each dependent's delta goes 3-way onto stock + its re-recorded
    requirements, its ``reproduces`` becomes that tree, and its evidence is kept and marked
    ``BASE_CHANGED``. All or nothing: any conflict raises, naming every dependent that conflicts (with its
    paths) or is blocked by one. ``skip``: dependents the same record rebuilds next from their sources.
    Returns the resolver holding the new records and {id: (record, delta text)}."""
    dependents = resolver.order(d for d in _dependents(resolver, entry_id) if d not in skip)
    rebased: dict[str, tuple[EntryRecord, bytes]] = {}
    problems: dict[str, tuple[str, list[str]]] = {}
    for dependent in dependents:
        record = resolver.records[dependent]
        blocked = sorted(r for r in resolver.closure(record.requires) if r in problems)
        if blocked:
            problems[dependent] = (f"blocked: it requires {', '.join(blocked)}", [])
            continue
        walk = resolver.walk(fork.stock_tree, resolver.chain([dependent]))
        bad = next((o for o in walk.outcomes if o.status == CONFLICT), None)
        if bad is not None:  # the first conflict of its chain (what follows it only lacks that entry's files)
            against = ", ".join(bad.conflicts_with) or "its new base"
            where = "" if bad.id == dependent else f" (in its chain, {bad.id})"
            problems[dependent] = (f"conflicts with {against}{where} in {', '.join(bad.paths)}", bad.paths)
            continue
        tree = resolver.tree_id(fork.stock_tree, walk, write=True)
        if tree == record.reproduces:
            continue
        base_walk = resolver.walk(fork.stock_tree, resolver.chain(record.requires))
        base_tree = resolver.tree_id(fork.stock_tree, base_walk, write=True)
        text = _diff(fork, base_tree, tree)
        delta = parse_delta(text, dependent, f"entries/{dependent}/delta.patch")
        fields = record.model_dump(exclude_defaults=True)
        if text != resolver.delta(dependent).text:
            _drop_ports(fields)
        source = {k: v for k, v in fields.get("source", {}).items() if k != "commit"}  # no commit holds this tree
        fields.update(
            reproduces=tree,
            kernels=_kernel_pins(fork, tree, delta),
            recorded=today,
            source=source,
            evidence=[
                {**e, "revalidate": f"{BASE_CHANGED} ({entry_id} was re-recorded)"} for e in fields.get("evidence", [])
            ],
        )
        new = EntryRecord.model_validate(fields)
        resolver = resolver.with_record(new, delta)
        if not resolver.reproduce(dependent).reproduced:
            raise ReproductionError(
                f"{dependent} rebased onto the new {entry_id} does not reproduce its own tree",
                where=f"entries/{dependent}",
                fix="report this: the store could not rebase its own diff",
            )
        rebased[dependent] = (new, text)
    if problems:
        conflicting = {d: paths for d, (_why, paths) in problems.items() if paths}
        by_hand = "; ".join(
            f"entries/{d}/{SRC}/{p}" for d, paths in conflicting.items() for p in paths if has_sources(fork.home, d)
        )
        resolve = (
            f" or resolve them in the same record: write each dependent's full version of the file over the new "
            f"{entry_id} at {by_hand} (it takes its patch's place), then run "
            f"`specpilot-mem record {entry_id} {' '.join(conflicting)} --src` (what they block follows)"
            if by_hand
            else " or re-record the conflicting entries by hand on the new version (apply it with --worktree, edit, "
            "record --from)"
        )
        raise ConflictError(
            f"re-recording {entry_id} would need its dependents rebased, and "
            f"{len(problems)} cannot be: " + "; ".join(f"{d} {why}" for d, (why, _paths) in problems.items()),
            where=", ".join(f"entries/{d}" for d in problems),
            fix=f"nothing was changed; change {entry_id} so it leaves those lines alone,{resolve}",
        )
    return resolver, rebased


def _dependents(resolver: Resolver, entry_id: str) -> list[str]:
    return sorted(i for i in resolver.records if i != entry_id and entry_id in resolver.closure([i]))


def _check_dependents(resolver: Resolver, entry_id: str, skip: frozenset[str] = frozenset()) -> list[str]:
    """Rebuild every entry that requires ``entry_id`` (but ``skip``); all must still reproduce."""
    dependents = [d for d in _dependents(resolver, entry_id) if d not in skip]
    failed = []
    for dependent in dependents:
        try:
            if not resolver.reproduce(dependent).reproduced:
                failed.append(f"{dependent} (no longer reproduces)")
        except SpecPilotError as err:
            failed.append(f"{dependent} ({err.what})")
    if failed:
        raise ReproductionError(
            f"changing {entry_id} breaks entries that require it: " + "; ".join(failed),
            where=", ".join(f"entries/{d.split()[0]}" for d in failed),
            fix="nothing was changed; re-record those entries on the new version first, or keep the old delta",
        )
    return dependents


def _check_id(entry_id: str) -> None:
    if not re.match(ENTRY_ID, entry_id):
        raise RecordError(
            f"{entry_id!r} is not a valid entry id",
            where="ID",
            fix="use lower-case words joined by '-', e.g. certified-head",
        )


def _plan_record(
    resolver: Resolver,
    entry_id: str,
    source_tree: str | None,
    source_commit: str | None,
    where: str,
    requires: list[str] | None,
    meta: str | Path | dict | None,
    today: dt.date,
    later: frozenset[str] = frozenset(),
    kernels: list[str] | None = None,
    earlier: tuple[str, ...] = (),
) -> tuple[Resolver, set[str]]:
    """Record ``entry_id`` on ``resolver`` (nothing is written): its new record and delta, every dependent
    rebased onto it and re-checked on other releases. ``source_tree`` None: build it from the entry's sources
    (``store.sources``) over its requirements, vendoring ``kernels`` (default: the op folders it vendors).
    ``later``: entries this record rebuilds next from their sources (they, and what requires them, are left
    for then); ``earlier``: entries re-recorded before it in the same change (where one is among its
    requirements, its evidence is marked ``BASE_CHANGED`` as a rebased dependent's is). Returns the resolver
    holding the new state and the ids whose record or delta it may change."""
    fork, records = resolver.fork, resolver.records
    home = fork.home
    existing = records.get(entry_id)
    draft, draft_text = _draft(meta)
    if draft.get("id", entry_id) != entry_id:
        raise RecordError(
            f"the draft's id {draft['id']!r} is not {entry_id!r}",
            where=str(meta),
            fix=f"remove the id line from the draft, or record it as {draft['id']}",
        )
    requires = list(existing.requires if existing and requires is None else (requires or []))
    for req in requires:
        if req not in records:
            raise RequirementError(
                f"{entry_id} requires {req!r}, which the memory does not hold",
                where="--requires",
                fix="record it first, or correct the id",
            )
    for req in requires:
        if entry_id in resolver.closure([req]):
            raise RequirementError(
                f"requirement cycle: {entry_id} -> {req} -> ... -> {entry_id}",
                where="--requires",
                fix=f"{req} already requires {entry_id}",
            )
    resolver.prepare(resolver.chain(requires))
    for req in resolver.chain(requires):
        outcome = resolver.reproduce(req)
        if not outcome.reproduced:
            raise ReproductionError(
                f"requirement {req} does not reproduce its record",
                where=f"entries/{req}",
                fix="run `specpilot-mem verify` and fix it first",
            )
    if source_tree is None:
        if not has_sources(home, entry_id):
            raise RecordError(
                f"entry {entry_id} has no sources",
                where=str(home.entry_dir(entry_id) / SRC),
                fix="put the files the entry adds or changes there, at their fork paths",
            )
        if kernels is None:
            kernels = vendored_sources(existing) if existing else []
        source_tree = sources_tree(resolver, entry_id, requires, read_sources(home, entry_id), kernels)
    base_walk = resolver.walk(fork.stock_tree, resolver.chain(requires))
    base_tree = resolver.tree_id(fork.stock_tree, base_walk, write=True)
    _check_built_on_requirements(fork, resolver, base_walk, source_tree, where)
    text = _diff(fork, base_tree, source_tree)
    delta = parse_delta(text, entry_id, f"entries/{entry_id}/{delta_path(home, entry_id).name}")
    check_symlinks(fork.repo, delta, where)

    fields = existing.model_dump(exclude_defaults=True) if existing else {}
    if existing and resolver.delta(entry_id).text != text:
        _drop_ports(fields)
    fields.update(draft)
    # the source commit is this recording's (a work tree has none, so an older one must not linger)
    source_fields = {k: v for k, v in fields.get("source", {}).items() if k != "commit"}
    fields["source"] = {**source_fields, "commit": source_commit} if source_commit else source_fields
    fields.update(
        id=entry_id,
        requires=requires,
        reproduces=source_tree,
        kernels=_kernel_pins(fork, source_tree, delta),
        recorded=today,
    )
    moved = [r for r in earlier if r in resolver.closure(requires)]  # requirements re-recorded before it
    if existing and moved and source_tree != existing.reproduces:
        because = f"{BASE_CHANGED} ({', '.join(moved)} {'was' if len(moved) == 1 else 'were'} re-recorded)"
        fields["evidence"] = [{**e, "revalidate": because} for e in fields.get("evidence", [])]
    if not existing and not draft:
        raise RecordError(
            f"{entry_id} is a new entry and has no title, summary or contract yet",
            where="--meta",
            fix="pass --meta draft.yaml (see `specpilot-mem schema` for the fields)",
        )
    record = validate_data(fields, EntryRecord, str(meta or entry_path(home, entry_id)), draft_text)

    # Prove it before writing anything: the new delta must rebuild the source, and dependents must rebase.
    skip = {d for d in _dependents(resolver, entry_id) if resolver.closure([d]) & later}
    for dependent in _dependents(resolver, entry_id):
        resolver.ensure_ready(dependent)  # proven against their old base, before that base changes
    trial = resolver.with_record(record, delta)
    outcome = trial.reproduce(entry_id)
    if not outcome.reproduced:
        raise ReproductionError(
            f"the recorded delta gives {outcome.tree}, not the source tree {source_tree}",
            where=where,
            fix="report this: the store could not reproduce its own diff",
        )
    trial, _rebased = _rebase_dependents(fork, trial, entry_id, today, skip)
    dependents = _check_dependents(trial, entry_id, frozenset(skip))
    # its checks on other releases, and its dependents' (whose chains changed), run again on the new records
    checked = recheck_releases(trial, [entry_id, *dependents], today)
    for changed in [entry_id, *dependents]:
        if checked[changed] != trial.records[changed]:
            trial = trial.with_record(checked[changed], trial.delta(changed))
    return trial, {entry_id, *dependents}


def _write(home: Home, records: dict[str, EntryRecord], trial: Resolver, ids: set[str]) -> None:
    """Write what ``trial`` changed of ``ids``: deltas, records, the sources of entries that keep them, then
    the branches (one ref transaction)."""
    sources = {i: render_sources(trial, i) for i in sorted(ids) if has_sources(home, i)}
    for entry_id in sorted(ids):
        write_atomic(delta_path(home, entry_id), trial.delta(entry_id).text)
        if trial.records[entry_id] != records.get(entry_id):
            write_atomic(entry_path(home, entry_id), dump_record(trial.records[entry_id]))
    for entry_id, files in sources.items():
        write_sources(home, entry_id, files)
    sync_branches(trial, only=ids)


def record_entry(
    home: Home,
    entry_id: str,
    source: str,
    requires: list[str] | None = None,
    meta: str | Path | dict | None = None,
    today: dt.date | None = None,
) -> EntryRecord:
    """Record (or re-record) ``entry_id`` from ``source`` (fork revision or fork work tree).

    ``requires`` defaults to the existing record's; ``meta`` (a draft YAML path or dict) gives title,
    summary, contract, options, variants, evidence ... and overrides the existing record's fields.
    Returns the saved record; every entry that requires it is rebased onto it (``_rebase_dependents``), and
    the sources of every changed entry that keeps them are written again (``store.sources``).
    """
    _check_id(entry_id)
    fork = open_fork(home)
    with fork.lock():
        records = load_entries(home)
        source_tree, source_commit = snapshot_tree(fork, source)
        today = today or dt.datetime.now(dt.timezone.utc).date()
        trial, changed = _plan_record(
            Resolver(fork, records), entry_id, source_tree, source_commit, str(source), requires, meta, today
        )
        _write(home, records, trial, changed)
        return trial.records[entry_id]


def record_sources(
    home: Home,
    ids: list[str],
    requires: list[str] | None = None,
    meta: str | Path | dict | None = None,
    kernels: list[str] | None = None,
    today: dt.date | None = None,
) -> list[EntryRecord]:
    """Re-record ``ids`` from their sources (``entries/<id>/src/`` and ``patches/``) and the kernel library, in
    requirement order, as one change: each is built over the new versions of those before it, then every
    entry that requires one is rebased; nothing is written unless all of it holds. ``requires``, ``meta`` and
    ``kernels`` (library paths to vendor; default: the op folders the record vendors) are for a single id
    (a new entry needs ``meta``). Returns the new records, in ``ids``' order."""
    for entry_id in ids:
        _check_id(entry_id)
    if len(ids) > 1 and (requires is not None or meta is not None or kernels is not None):
        raise RecordError(
            "requirements, a draft and kernels are given for one entry at a time",
            where="record --src",
            fix="record the entries one by one, or without --requires/--meta",
        )
    fork = open_fork(home)
    with fork.lock():
        records = load_entries(home)
        resolver = Resolver(fork, records)
        known = [i for i in ids if i in records]
        order = resolver.order(known) + [i for i in ids if i not in records]
        today = today or dt.datetime.now(dt.timezone.utc).date()
        changed: set[str] = set()
        for n, entry_id in enumerate(order):
            resolver, ids_changed = _plan_record(
                resolver,
                entry_id,
                None,
                None,
                f"entries/{entry_id}/{SRC}",
                requires,
                meta,
                today,
                later=frozenset(order[n + 1 :]),
                kernels=kernels,
                earlier=tuple(order[:n]),
            )
            changed |= ids_changed
        _write(home, records, resolver, changed)
        return [resolver.records[i] for i in ids]


def _update(home: Home, entry_id: str, change) -> EntryRecord:
    fork = open_fork(home)
    with fork.lock():
        records = load_entries(home)
        closure(records, [entry_id], home)  # an unknown id or a broken requirement stops here
        record = change(records[entry_id].model_copy(deep=True))
        record = EntryRecord.model_validate(record.model_dump())
        resolver = Resolver(fork, {**records, entry_id: record})
        dependents = _check_dependents(resolver, entry_id)
        write_atomic(entry_path(home, entry_id), dump_record(record))
        sync_branches(resolver, only={entry_id, *dependents})
        return record


def add_variant(home: Home, entry_id: str, variant: Variant | str | Path) -> EntryRecord:
    """Add (or replace, by name) a variant of ``entry_id``."""
    new = variant if isinstance(variant, Variant) else load_record_file(Path(variant), Variant)

    def change(record: EntryRecord) -> EntryRecord:
        record.variants = [v for v in record.variants if v.name != new.name] + [new]
        return record

    return _update(home, entry_id, change)


def add_evidence(home: Home, entry_id: str, evidence: Evidence | str | Path) -> EntryRecord:
    """Add evidence (e.g. the entry re-timed on a new deployment: never a new entry)."""
    new = evidence if isinstance(evidence, Evidence) else load_record_file(Path(evidence), Evidence)

    def change(record: EntryRecord) -> EntryRecord:
        if new in record.evidence:
            raise RecordError(f"{entry_id} already holds this evidence", where=f"entries/{entry_id}/entry.yaml")
        record.evidence = record.evidence + [new]
        return record

    return _update(home, entry_id, change)
