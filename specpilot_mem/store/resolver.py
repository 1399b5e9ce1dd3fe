"""The resolver: requirement closure, deterministic order, 3-way application onto a tree, reproduction.

Order (``requirements.order``): the order of a requirement-closed set without its last entry is
exactly its prefix, so the tree of every prefix is memoized (key: base tree + ordered ids) and shared
between chains — ``verify`` resolves each entry's closure mostly from memo hits.

Application, per file of an entry's delta, against the accumulating tree (never a work tree), with
the semantics of ``git apply --3way``: current == post-image -> already there; current == pre-image
-> take the post-image; otherwise the entry's hunks applied to the current text (exact lines, at an
offset), and where they do not match, a 3-way merge of the (pre, current, post) blobs with
``git merge-file``; anything else is a conflict. A vendored kernel file (``store.kernels.VENDOR_DIR``) is a
byte copy of a library file owned by the entry that vendors it, never merged: where an earlier entry of the
chain vendored another copy of the same file, the entry's copy replaces it (entries that vendor the same
library file, e.g. the shared ``csrc/`` headers, compose whatever versions of it they were recorded with).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from specpilot_mem.errors import ConflictError, DeltaError, ForkError, ReproductionError, UnknownEntryError
from specpilot_mem.git import Repo, Signature, commit_content, object_id
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord
from specpilot_mem.store.delta import (
    SYMLINK_MODE,
    Delta,
    FileChange,
    apply_hunks,
    check_symlink,
    hunks_present,
    load_delta,
)
from specpilot_mem.store.fork import ENTRY_REF_PREFIX, Fork, open_fork
from specpilot_mem.store.kernels import VENDOR_DIR
from specpilot_mem.store.records import delta_path, load_entries
from specpilot_mem.store.releases import RELEASE_REF_PREFIX, import_release, is_release_spec
from specpilot_mem.store.requirements import closure, order
from specpilot_mem.store.stock import STOCK_TIMESTAMP
from specpilot_mem.store.trees import BaseTree, Entry, base_tree, overlay_tree_id

APPLIED, PRESENT, PARTLY, EMPTY, CONFLICT = "applied", "already present", "partly present", "empty", "conflict"
# How one file of a delta went onto the accumulating tree: as recorded (the file was the delta's
# pre-image), hunks (the file had changed, the hunks matched it exactly), merged (3-way merge needed),
# present (the base already has the change), partly present (some of its hunks were already there, the
# rest went on), vendored copy replaced (an earlier entry's copy of the same vendored kernel file), conflict.
AS_RECORDED, BY_HUNKS, MERGED, ALREADY_THERE, PARTLY_THERE, REPLACED, FILE_CONFLICT = (
    "as recorded",
    "hunks",
    "merged",
    "present",
    "partly present",
    "vendored copy replaced",
    "conflict",
)


@dataclass
class EntryOutcome:
    id: str
    status: str
    paths: list[str] = field(default_factory=list)  # files it changed, or the conflicting ones
    conflicts_with: list[str] = field(default_factory=list)  # earlier entries that changed those files
    reproduces: str | None = None  # the record's pinned tree
    tree: str | None = None  # what its own chain gave onto stock (checked against reproduces)
    files: dict[str, str] = field(default_factory=dict)  # every path of its delta -> how it went (AS_RECORDED ...)
    present: list[str] = field(default_factory=list)  # what the base already had: "path" or "path: hunks 1, 3"

    @property
    def reproduced(self) -> bool | None:
        return None if self.tree is None else self.tree == self.reproduces


@dataclass
class Walk:
    """The accumulating tree after applying some entries in order onto a base."""

    overlay: dict[str, Entry | None] = field(default_factory=dict)
    touched: dict[str, list[str]] = field(default_factory=dict)
    outcomes: tuple[EntryOutcome, ...] = ()
    tree: str | None = None


@dataclass
class ApplyResult:
    requested: list[str]
    order: list[str]
    onto: str
    onto_commit: str
    tree: str
    outcomes: list[EntryOutcome]
    commit: str | None = None
    branch: str | None = None
    worktree: str | None = None
    export: dict | None = None
    release: dict | None = None  # the SGLang release imported as the base, when ``onto`` named one

    @property
    def conflicts(self) -> list[EntryOutcome]:
        return [o for o in self.outcomes if o.status == CONFLICT]


def commit_date(records: Iterable[EntryRecord]) -> Signature:
    """Commit dates derived from the records (latest ``recorded``), never from the clock."""
    dates = [r.recorded for r in records if r.recorded]
    if not dates:
        return Signature(STOCK_TIMESTAMP)
    latest = max(dates)
    return Signature(int(dt.datetime(latest.year, latest.month, latest.day, tzinfo=dt.timezone.utc).timestamp()))


class Resolver:
    """Resolves entry chains of one fork; memoizes parsed deltas, base trees and prefix walks."""

    def __init__(
        self,
        fork: Fork,
        records: dict[str, EntryRecord] | None = None,
        ports: dict[str, tuple[Delta, str]] | None = None,
    ):
        """``ports``: entry id -> (ported delta, the release tree it was ported onto), used in place of the
        recorded delta (which is against stock) where given."""
        self.fork = fork
        self.ports = dict(ports or {})
        self.repo: Repo = fork.repo
        self.records = load_entries(fork.home) if records is None else records
        self._deltas: dict[str, Delta] = {}
        self._walks: dict[tuple[str, tuple[str, ...]], Walk] = {}
        self._ready: set[str] = set()
        self._prefetched: set[str] = set()
        self._written: set[str] = set()
        self._verified_file = self.repo.common_dir / "specpilot" / "verified-deltas"
        self._verified = set(self._verified_file.read_text().split()) if self._verified_file.exists() else set()

    def with_record(self, record: EntryRecord, delta: Delta) -> Resolver:
        """A resolver for this memory with ``record`` (and its ``delta``) added or replaced, keeping
        every parsed delta and memoized walk that does not involve it."""
        other = Resolver(self.fork, {**self.records, record.id: record}, self.ports)
        other._deltas = {k: v for k, v in self._deltas.items() if k != record.id} | {record.id: delta}
        other._walks = {k: v for k, v in self._walks.items() if record.id not in k[1]}
        other._ready = self._ready - {record.id}
        other._prefetched = self._prefetched - {record.id}
        other._written = self._written
        return other

    def with_ports(self, records: dict[str, EntryRecord], ports: dict[str, tuple[Delta, str]]) -> Resolver:
        """A resolver of ``records`` (the same entries) with this one's parsed deltas (a re-record's, before
        they are written), applying ``ports`` where given."""
        other = Resolver(self.fork, records, ports)
        other._deltas = dict(self._deltas)
        other._written = self._written
        return other

    # -- requirements ------------------------------------------------------------------------------
    def closure(self, ids: Iterable[str]) -> set[str]:
        return closure(self.records, ids, self.fork.home)

    def order(self, ids: Iterable[str]) -> list[str]:
        return order(self.records, ids)

    def chain(self, ids: Iterable[str]) -> list[str]:
        return self.order(self.closure(ids))

    # -- deltas and trees ----------------------------------------------------------------------------
    def delta(self, entry_id: str) -> Delta:
        if entry_id in self.ports:
            return self.ports[entry_id][0]
        if entry_id not in self._deltas:
            self._deltas[entry_id] = load_delta(delta_path(self.fork.home, entry_id), entry_id)
        return self._deltas[entry_id]

    def base(self, tree_id: str) -> BaseTree:
        return base_tree(self.repo, tree_id)

    def tree_id(self, base_tree: str, walk: Walk, write: bool = False) -> str:
        if write:
            return overlay_tree_id(self.base(base_tree), walk.overlay, lambda c: self.repo.write_object("tree", c))
        if walk.tree is None:
            walk.tree = overlay_tree_id(self.base(base_tree), walk.overlay)
        return walk.tree

    def walk(self, base_tree: str, order: list[str]) -> Walk:
        """The memoized walk applying ``order`` onto ``base_tree``; conflicts are recorded, not raised."""
        key = (base_tree, tuple(order))
        if key in self._walks:
            return self._walks[key]
        start = len(order)
        while start > 0 and (base_tree, tuple(order[:start])) not in self._walks:
            start -= 1
        walk = self._walks.get((base_tree, tuple(order[:start])), Walk())
        self._check_posts(order[start:])
        for n in range(start, len(order)):
            self.ensure_ready(order[n])
            walk = self._step(base_tree, walk, order[n])
            self._walks[(base_tree, tuple(order[: n + 1]))] = walk
        return walk

    def stock_tree(self, ids: Iterable[str]) -> str:
        """The tree of ``ids`` with their requirements applied onto stock."""
        return self.tree_id(self.fork.stock_tree, self.walk(self.fork.stock_tree, self.chain(ids)))

    def _step(self, base_tree: str, walk: Walk, entry_id: str) -> Walk:
        base = self.base(base_tree)
        delta = self.delta(entry_id)
        prefix = self.fork.package_prefix
        overlay = dict(walk.overlay)
        touched = dict(walk.touched)
        changed, conflicts, against, files, present = [], [], set(), {}, []

        def current(path: str) -> Entry | None:
            return overlay[path] if path in overlay else base.files.get(path)

        for change in delta.changes:
            path = prefix + change.path
            now = current(path)
            outcome, files[change.path], hunks = self.apply_file(change, now, change.path.startswith(_VENDORED))
            if files[change.path] == ALREADY_THERE:
                present.append(change.path)
            elif hunks:
                present.append(f"{change.path}: hunk{'s' if len(hunks) > 1 else ''} {', '.join(map(str, hunks))}")
            if outcome is UNCHANGED:
                continue
            if outcome is CONFLICTED:
                conflicts.append(change.path)
                against.update(touched.get(path, []))
                continue
            overlay[path] = outcome
            touched[path] = touched.get(path, []) + [entry_id]
            changed.append(change.path)
        if not delta.changes:
            status, paths = EMPTY, []
        elif conflicts:
            status, paths = CONFLICT, conflicts
        elif not changed:
            status, paths = PRESENT, []
        else:
            status, paths = (PARTLY if present else APPLIED), changed
        outcome = EntryOutcome(
            entry_id,
            status,
            paths,
            sorted(against),
            self.records[entry_id].reproduces,
            files=files,
            present=present if status != CONFLICT else [],
        )
        if status == CONFLICT:  # the conflicting entry leaves the tree as it was
            overlay, touched = walk.overlay, walk.touched
        return Walk(overlay, touched, walk.outcomes + (outcome,))

    def apply_file(
        self, change: FileChange, now: Entry | None, vendored: bool = False
    ) -> tuple[object, str, tuple[int, ...]]:
        """(the file's new entry, or UNCHANGED / CONFLICTED; how it went; the hunks already there).
        ``vendored``: the path is a vendored kernel copy, which replaces another copy instead of merging."""
        if change.mode_only:
            if now is None:
                return CONFLICTED, FILE_CONFLICT, ()
            if now[0] == change.new_mode:
                return UNCHANGED, ALREADY_THERE, ()
            if now[0] == change.old_mode:
                return (change.new_mode, now[1]), AS_RECORDED, ()
            return CONFLICTED, FILE_CONFLICT, ()
        post = None if change.deleted else (change.new_mode, change.new_oid)
        pre = None if change.added else (change.old_mode, change.old_oid)
        if now == post:
            return UNCHANGED, ALREADY_THERE, ()
        if now == pre:
            return post, AS_RECORDED, ()
        if vendored and now is not None and post is not None:
            return post, REPLACED, ()
        if now is None or pre is None or post is None or change.binary:
            return CONFLICTED, FILE_CONFLICT, ()
        merged = self._merge(change, pre[1], now[1], post[1])
        if merged is None:
            return CONFLICTED, FILE_CONFLICT, ()
        oid, how, present = merged
        if oid == now[1]:  # the file already had every change of the entry
            return UNCHANGED, ALREADY_THERE, ()
        mode = post[0] if now[0] == pre[0] else now[0]
        return (mode, oid), (PARTLY_THERE if present else how), present

    def _merge(self, change: FileChange, pre: str, now: str, post: str) -> tuple[str, str, tuple[int, ...]] | None:
        """The entry's hunks applied to the current text (as ``git apply`` would, leaving a hunk that is
        already there alone); where they do not match, a real 3-way merge of (pre, current, post) with
        ``git merge-file``. Memoized by blob ids. Returns (merged blob id, BY_HUNKS or MERGED, the numbers
        of the hunks the current text already had), or None on conflict."""
        key = (pre, now, post)
        if key not in _MERGES:
            current = self._blob(now)
            applied, how = apply_hunks(current, change.hunks), BY_HUNKS
            if applied is None:
                merged = self.repo.merge_blobs(pre, now, post)
                applied = (
                    None
                    if merged is None
                    else (self.repo.read_blobs([merged])[merged], hunks_present(current, change.hunks))
                )
                how = MERGED
            _MERGES[key] = None if applied is None else (object_id("blob", applied[0]), applied[0], how, applied[1])
        if _MERGES[key] is None:
            return None
        oid, content, how, present = _MERGES[key]
        if oid not in self._written:  # this fork may not have it yet
            self.repo.write_blob(content)
            self._written.add(oid)
            _BLOBS[oid] = content
        return oid, how, present

    def _blob(self, oid: str) -> bytes:
        """Blob content, cached for the process; a miss fetches every blob the loaded deltas and
        memoized walks refer to in one ``cat-file --batch``, since merges come in runs."""
        if oid not in _BLOBS:
            wanted = {oid}
            for entry_id in self._ready - self._prefetched:
                for change in self.delta(entry_id).changes:
                    wanted.update(x for x in (change.old_oid, change.new_oid) if x and not change.binary)
            self._prefetched |= self._ready
            _BLOBS.update(self.repo.read_blobs(wanted - _BLOBS.keys(), skip_missing=True))
        return _BLOBS[oid]

    def prepare(self, ids: Iterable[str]) -> None:
        """Check many entries' post-images at once (``verify`` calls it with every entry)."""
        self._check_posts(list(ids))

    # -- proving deltas -------------------------------------------------------------------------------
    def _check_posts(self, ids: list[str]) -> None:
        """Mark proven deltas whose post-images are all in the fork as ready: one git call for many."""
        proven = [i for i in ids if i not in self._ready and self.delta(i).sha256 in self._verified]
        posts = {i: [c.new_oid for c in self.delta(i).changes if c.new_oid] for i in proven}
        missing = self.repo.missing_objects(oid for oids in posts.values() for oid in oids)
        self._ready.update(i for i, oids in posts.items() if not missing.intersection(oids))

    def ensure_ready(self, entry_id: str) -> None:
        """Make sure the delta's post-image blobs are in the fork and its text produces them.

        Once per delta content per fork, ``git apply --cached`` runs it on a scratch index holding its
        pre-images (from its own base: stock + its requirements); the result must carry exactly the
        blob ids the delta declares, else the delta is corrupt.
        """
        if entry_id in self._ready:
            return
        delta = self.delta(entry_id)
        posts = [c.new_oid for c in delta.changes if c.new_oid]
        if not delta.changes or (delta.sha256 in self._verified and not self.repo.missing_objects(posts)):
            self._ready.add(entry_id)
            return
        requirements = self.chain(self.records[entry_id].requires)
        origin = (
            self.ports[entry_id][1] if entry_id in self.ports else self.fork.stock_tree
        )  # what the delta is against
        base_walk = self.walk(origin, requirements)
        base = self.base(origin)
        prefix = self.fork.package_prefix

        def before(path: str) -> Entry | None:
            return base_walk.overlay[path] if path in base_walk.overlay else base.files.get(path)

        index_lines = []
        for change in delta.changes:
            if change.added:
                continue
            entry = before(prefix + change.path)
            if entry is None or (change.old_oid and entry != (change.old_mode, change.old_oid)):
                raise DeltaError(
                    f"the delta of {entry_id} expects {change.path} at {change.old_oid}, but stock with its "
                    f"requirements ({', '.join(requirements) or 'none'}) has {entry[1] if entry else 'no such file'}",
                    where=str(delta_path(self.fork.home, entry_id)),
                    fix=f"re-record {entry_id} from a commit built on its requirements",
                )
            index_lines.append(f"{entry[0]} {entry[1]}\t{prefix}{change.path}")
        with self.repo.temporary_index() as env:
            if index_lines:  # a delta that only adds files has no pre-images
                self.repo.git("update-index", "--index-info", input=("\n".join(index_lines) + "\n").encode(), env=env)
            args = ["apply", "--cached", "--whitespace=nowarn"] + ([f"--directory={prefix}"] if prefix else []) + ["-"]
            proc = self.repo.git(*args, input=delta.text, env=env, check=False)
            if proc.returncode != 0:
                raise DeltaError(
                    f"the delta of {entry_id} does not apply to its own base: "
                    f"{proc.stderr.decode(errors='replace').strip()[:500]}",
                    where=str(delta_path(self.fork.home, entry_id)),
                    fix=f"restore it from git, or re-record it with `specpilot-mem record {entry_id}`",
                )
            result = {}
            for line in self.repo.git("ls-files", "-s", "-z", env=env).stdout.split(b"\0"):
                if line:
                    meta, path = line.decode().split("\t", 1)
                    mode, oid, _stage = meta.split()
                    result[path] = (mode, oid)
        for change in delta.changes:
            got = result.get(prefix + change.path)
            want = None if change.deleted else (change.new_mode, change.new_oid or before(prefix + change.path)[1])
            if got != want:
                raise DeltaError(
                    f"corrupted delta: {change.path} comes out as {got}, but the delta declares {want}",
                    where=str(delta_path(self.fork.home, entry_id)),
                    fix=f"restore it from git, or re-record it with `specpilot-mem record {entry_id}`",
                )
        self._verified.add(delta.sha256)
        self._verified_file.parent.mkdir(exist_ok=True)
        with open(self._verified_file, "a") as handle:
            handle.write(delta.sha256 + "\n")
        self._ready.add(entry_id)

    # -- reproduction -------------------------------------------------------------------------------
    def reproduce(self, entry_id: str) -> EntryOutcome:
        """Rebuild ``entry_id``'s chain from stock and compare with its record's ``reproduces``."""
        order = self.chain([entry_id])
        walk = self.walk(self.fork.stock_tree, order)
        bad = next((o for o in walk.outcomes if o.status == CONFLICT), None)
        if bad is not None:
            raise ConflictError(
                f"{bad.id} conflicts with {', '.join(bad.conflicts_with) or 'stock'} in the chain of {entry_id}",
                where="files: " + ", ".join(bad.paths),
                fix=f"re-record {bad.id} on top of its requirements",
            )
        outcome = walk.outcomes[-1]
        outcome.tree = self.tree_id(self.fork.stock_tree, walk)
        return outcome


_VENDORED = VENDOR_DIR + "/"
# Content-addressed, so valid across resolvers and forks of this process.
_MERGES: dict[tuple[str, str, str], tuple[str, bytes, str, tuple[int, ...]] | None] = {}
_BLOBS: dict[str, bytes] = {}


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


UNCHANGED = _Marker("unchanged")
CONFLICTED = _Marker("conflict")


def _onto(fork: Fork, onto: str) -> tuple[str, str]:
    if onto == "stock":
        return fork.stock_commit, fork.stock_tree
    commit = fork.repo.rev_parse(f"{onto}^{{commit}}")
    if commit is None:
        raise ForkError(
            f"the fork has no revision {onto!r}",
            where="--onto",
            fix="pass `stock`, a branch, a tag or a commit of the fork",
        )
    return commit, fork.repo.rev_parse(f"{commit}^{{tree}}")


def apply_entries(
    home: Home,
    ids: list[str],
    onto: str = "stock",
    branch: str | None = None,
    worktree: str | None = None,
    export: str | None = None,
    force: bool = False,
    resolver: Resolver | None = None,
) -> ApplyResult:
    """Apply ``ids`` with their requirements onto ``onto``: ``stock``, a fork revision, or an SGLang release
    (``sglang==X`` or a wheel path, imported beside stock by ``store.releases``; entries ported to it use their port).

    Onto stock every entry whose chain builds must reproduce its record (``ReproductionError``); on any
    base, conflicts are reported in the result (per entry: status, paths, the entries it conflicts with),
    and refuse a branch, worktree or export (``ConflictError``). ``branch`` writes
    ``refs/heads/<branch>``, ``worktree`` checks the result out there, ``export`` writes an SGLang
    package (``specpilot_mem.sglang.export``). Refs change only after every check passed.
    """
    if not ids:
        raise UnknownEntryError("no entries to apply", where="apply", fix="name at least one entry id, or pass --all")
    fork = resolver.fork if resolver else open_fork(home)
    # only a target (or importing a release) changes the fork; a plain apply reads it beside other readers
    with fork.lock(shared=not (branch or worktree or export or is_release_spec(onto))):
        resolver = resolver or Resolver(fork)
        order = resolver.chain(ids)
        release = None
        if is_release_spec(onto):
            from specpilot_mem.store.port import release_resolver

            release = import_release(fork, onto)
            resolver = release_resolver(fork, resolver.records, release)
            onto_commit, onto_tree = release.commit, release.tree
        else:
            onto_commit, onto_tree = _onto(fork, onto)
        on_stock = onto_tree == fork.stock_tree
        walk = resolver.walk(onto_tree, order)
        outcomes = [EntryOutcome(**vars(o)) for o in walk.outcomes]
        conflicts = [o for o in outcomes if o.status == CONFLICT]
        if release is not None and not conflicts:
            _check_ports(resolver, release, outcomes)
        if on_stock:
            failed = []
            conflicting = {o.id for o in conflicts}
            for outcome in outcomes:
                if conflicting & set(resolver.chain([outcome.id])):
                    continue  # its chain does not build: the conflict is the report
                outcome.tree = resolver.reproduce(outcome.id).tree
                if not outcome.reproduced:
                    failed.append(outcome)
            if failed:
                raise ReproductionError(
                    "entries that do not reproduce their source tree: "
                    + ", ".join(f"{o.id} (got {o.tree[:12]}, record says {o.reproduces[:12]})" for o in failed),
                    where=", ".join(f"entries/{o.id}" for o in failed),
                    fix="run `specpilot-mem verify` for details; re-record them with `specpilot-mem record`",
                )
        result = ApplyResult(
            list(ids),
            order,
            onto,
            onto_commit,
            resolver.tree_id(onto_tree, walk),
            outcomes,
            release=release.to_dict() if release else None,
        )
        if (branch or worktree or export) and conflicts:
            target = "branch" if branch else "worktree" if worktree else "export"
            raise ConflictError(
                f"the result has conflicts, so no {target} was written: "
                + "; ".join(
                    f"{o.id} conflicts with {', '.join(o.conflicts_with) or onto} in {', '.join(o.paths)}"
                    for o in conflicts
                ),
                where="files: " + ", ".join(p for o in conflicts for p in o.paths),
                fix="apply without --branch/--worktree/--export to see the report; record one entry on top of "
                "the other (requires), or leave one out",
            )
        if branch or worktree:
            result.commit = _write_result(resolver, onto, onto_commit, onto_tree, walk, order)
            if branch:
                result.branch = _write_branch(fork, branch, result.commit, force)
            if worktree:
                result.worktree = _checkout(fork, Path(worktree), result.commit)
        if export:
            from specpilot_mem.sglang.export import export_tree

            destination = Path(export).expanduser().resolve()
            blocking = next((p for p in destination.parents if p.exists() and not p.is_dir()), None)
            if blocking is not None:
                raise ForkError(
                    f"cannot export to {destination}: {blocking} is a file, not a folder",
                    where="--export",
                    fix="pass a path whose folders are folders",
                )
            check_leftovers(fork, destination)
            for entry_id in order:  # a symlink out of the tree is never written out, whatever the record says
                check_symlinks(fork.repo, resolver.delta(entry_id), f"entries/{entry_id}")

            resolver.tree_id(onto_tree, walk, write=True)
            result.export = export_tree(home, result.tree, Path(export), order)
        return result


def check_symlinks(repo: Repo, delta: Delta, where: str) -> None:
    """Every symlink ``delta`` adds or changes must stay inside the tree (``delta.check_symlink``)."""
    links = [c for c in delta.changes if c.new_mode == SYMLINK_MODE and c.new_oid]
    blobs = repo.read_blobs(c.new_oid for c in links) if links else {}
    for change in links:
        check_symlink(change.path, blobs[change.new_oid], where)


def _check_ports(resolver: Resolver, release, outcomes: list[EntryOutcome]) -> None:
    """Each ported entry's chain onto the release must give the tree its port recorded."""
    failed = []
    for outcome in outcomes:
        if outcome.id in resolver.ports:
            port = resolver.records[outcome.id].release_check(release.version).port
            outcome.reproduces = port.reproduces
            outcome.tree = resolver.tree_id(release.tree, resolver.walk(release.tree, resolver.chain([outcome.id])))
            if not outcome.reproduced:
                failed.append(outcome)
    if failed:
        raise ReproductionError(
            f"ported entries that do not reproduce their port's tree on SGLang {release.version}: "
            + ", ".join(f"{o.id} (got {o.tree[:12]}, the port says {o.reproduces[:12]})" for o in failed),
            where=", ".join(f"entries/{o.id}" for o in failed),
            fix=f"port them again: specpilot-mem port {' '.join(o.id for o in failed)} --onto sglang=={release.version}",
        )


def _write_result(resolver: Resolver, onto: str, onto_commit: str, onto_tree: str, walk: Walk, order: list[str]) -> str:
    tree = resolver.tree_id(onto_tree, walk, write=True)
    lines = [f"apply {' '.join(order)} onto {onto}", ""]
    lines += [f"{o.id}: {o.status}" for o in walk.outcomes]
    content = commit_content(tree, [onto_commit], "\n".join(lines), commit_date(resolver.records[i] for i in order))
    return resolver.repo.write_object("commit", content)


def _write_branch(fork: Fork, branch: str, commit: str, force: bool) -> str:
    ref = branch if branch.startswith("refs/") else f"refs/heads/{branch}"
    if ref.startswith((ENTRY_REF_PREFIX, RELEASE_REF_PREFIX)) or ref == "refs/heads/stock":
        raise ForkError(f"{branch} is managed by specpilot-mem", where="--branch", fix="use a name like deploy/NAME")
    if fork.repo.git("check-ref-format", ref, check=False).returncode != 0:
        raise ForkError(f"{branch!r} is not a valid branch name", where="--branch", fix="use a name like deploy/NAME")
    old = fork.repo.rev_parse(ref)
    if old and old != commit and not force:
        raise ForkError(
            f"branch {branch} already exists at {old[:12]}",
            where="--branch",
            fix="choose another name, or pass --force to move it",
        )
    if old != commit:
        fork.repo.update_refs({ref: (old, commit)}, f"specpilot apply: {branch}")
    return ref


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_leftovers(fork: Fork, target: Path) -> None:
    """Refuse to write ``target`` while a half-built copy of it from an interrupted run lies beside it
    (``.<name>.worktree-PID`` or ``.<name>.export-PID`` of a process that is gone), naming the command
    that removes it."""
    for leftover in sorted(target.parent.glob(f".{target.name}.*-*")):
        kind, _, pid = leftover.name[len(target.name) + 2 :].rpartition("-")
        if kind not in ("worktree", "export", "retired") or not pid.isdigit() or _pid_alive(int(pid)):
            continue
        remove = (
            f"git -C {fork.repo.path} worktree remove --force {leftover}"
            if (leftover / ".git").is_file()
            else f"rm -rf {leftover}"
        )
        raise ForkError(
            f"{leftover} is left over from an interrupted specpilot-mem run (pid {pid}, gone)",
            where=str(target),
            fix=f"remove it, then run the command again: {remove}",
        )


def _checkout(fork: Fork, path: Path, commit: str) -> str:
    """Check ``commit`` out at ``path``: built beside it (``.<name>.worktree-PID``) and moved into place at
    the end, so an interrupted run leaves ``path`` as it was."""
    path = path.expanduser().resolve()
    check_leftovers(fork, path)
    existing = path.exists() and (not path.is_dir() or any(path.iterdir()))
    if existing:
        target = Repo(path)
        if not path.is_dir() or not target.exists() or target.common_dir.resolve() != fork.repo.common_dir.resolve():
            raise ForkError(
                f"{path} exists and is not a work tree of the fork",
                where="--worktree",
                fix="pass a new folder, or an existing worktree of sglang-fork",
            )
        if target.is_dirty():
            raise ForkError(
                f"the work tree {path} has uncommitted changes",
                where="--worktree",
                fix="commit or discard them first (git -C PATH status)",
            )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ForkError(
            f"cannot create the folder for the work tree: {err}",
            where="--worktree",
            fix="pass a path in a writable folder",
        ) from None
    scratch = path.parent / f".{path.name}.worktree-{os.getpid()}"
    retired = path.parent / f".{path.name}.retired-{os.getpid()}"
    try:
        fork.repo.git("worktree", "add", "--quiet", "--detach", str(scratch), commit)
        if existing:
            fork.repo.git("worktree", "move", str(path), str(retired))
        elif path.exists():
            path.rmdir()  # an empty folder
        fork.repo.git("worktree", "move", str(scratch), str(path))
    except BaseException:
        if retired.exists() and not path.exists():
            fork.repo.git("worktree", "move", str(retired), str(path), check=False)
        fork.repo.git("worktree", "remove", "--force", str(scratch), check=False)
        shutil.rmtree(scratch, ignore_errors=True)
        fork.repo.git("worktree", "prune", check=False)
        raise
    if retired.exists():
        fork.repo.git("worktree", "remove", "--force", str(retired))
    return str(path)
