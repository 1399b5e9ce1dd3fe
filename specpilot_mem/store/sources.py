"""An entry's reviewable sources: each file once, whole where the entry owns it, a patch where it does not.

``entries/<id>/src/<fork path>`` holds in full each file the entry adds or changes that none of its
requirements changes (a stock file or a new one): it can be read, tested and diffed against stock.
``entries/<id>/patches/<fork path>.patch`` holds, for a file a requirement changes too (or one the entry
deletes or changes the mode of), only the entry's own change: that file's section of ``delta.patch``, against
the version the requirements leave. Vendored kernel files (``kernels.VENDOR_DIR``) are no sources: rebuilding
vendors them from the library. So no file lives in two entries, and the sources are a function of the delta
(``render_sources``): every record re-renders them for the entry and each dependent it rebased, so
re-recording a requirement never leaves a stale copy behind.

Building from sources (``sources_tree``) lays the whole files over the base (stock + requirements) and applies
each patch as the resolver applies a delta's file (as recorded, by hunks at an offset, or 3-way), so a patch
follows its requirement when that moved; a patch that no longer applies is a ``ConflictError`` naming the
file, the requirements that changed it and the fix. A whole file at a patch's path takes its place: that is
how a conflict is resolved by hand (and how sources of the older whole-copy layout still build).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from specpilot_mem.errors import ConflictError, DeltaError
from specpilot_mem.home import Home
from specpilot_mem.store.delta import FileChange, apply_hunks, parse_delta
from specpilot_mem.store.kernels import VENDOR_DIR, library_files, package_markers
from specpilot_mem.store.records import replace_folder
from specpilot_mem.store.resolver import CONFLICTED, UNCHANGED, Resolver
from specpilot_mem.store.trees import Entry, overlay_tree_id

SRC, PATCHES, PATCH_SUFFIX = "src", "patches", ".patch"
_REGULAR = "100644"
_DIFF_HEADER = b"diff --git "


def has_sources(home: Home, entry_id: str) -> bool:
    """Whether ``entry_id`` keeps its files as sources (SGLang entries do; entries recorded from a fork
    revision alone need not)."""
    folder = home.entry_dir(entry_id)
    return (folder / SRC).is_dir() or (folder / PATCHES).is_dir()


def read_sources(home: Home, entry_id: str) -> dict[str, bytes]:
    """``src/...`` and ``patches/...`` files of the entry (relative to its folder) -> bytes; caches left out."""
    folder = home.entry_dir(entry_id)
    files = {}
    for kind in (SRC, PATCHES):
        root = folder / kind
        if root.is_dir():
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    files[path.relative_to(folder).as_posix()] = path.read_bytes()
    return files


def delta_sections(text: bytes) -> list[bytes]:
    """A delta's text cut into one section per file, in order (a header line never starts a hunk line,
    which starts with ' ', '+', '-' or '\\', nor a base85 line, which holds no space)."""
    if not text:
        return []
    starts = [0] + [i + 1 for i in _find_all(text, b"\n" + _DIFF_HEADER)]
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def _find_all(text: bytes, needle: bytes) -> list[int]:
    found, at = [], text.find(needle)
    while at >= 0:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def render_sources(resolver: Resolver, entry_id: str) -> dict[str, bytes]:
    """The entry's sources as its record and delta (in ``resolver``) define them: relative path -> bytes."""
    record = resolver.records[entry_id]
    delta = resolver.delta(entry_id)
    fork = resolver.fork
    touched = resolver.walk(fork.stock_tree, resolver.chain(record.requires)).overlay
    sections = delta_sections(delta.text)
    whole, files = {}, {}
    for change, section in zip(delta.changes, sections, strict=True):
        if change.path.startswith(VENDOR_DIR + "/"):
            continue
        if fork.package_prefix + change.path not in touched and change.new_mode == _REGULAR and change.new_oid:
            whole[f"{SRC}/{change.path}"] = change.new_oid
        else:
            files[f"{PATCHES}/{change.path}{PATCH_SUFFIX}"] = section
    blobs = resolver.repo.read_blobs(whole.values())
    return {**{path: blobs[oid] for path, oid in whole.items()}, **files} if whole or files else {}


def _apply_patch(resolver: Resolver, change: FileChange, now: Entry | None):
    """A source patch onto the file's current entry: its new entry, ``UNCHANGED`` or ``CONFLICTED``.

    A text patch goes by its hunks (exact lines at an offset), so a patch edited by hand means what it says;
    where they do not match, a 3-way merge of the blobs its index line names, provided its hunks are still the
    change between them. Binary, mode-only and deleting patches, and new files, go as the resolver applies a
    delta's file."""
    if change.binary or change.mode_only or change.deleted or change.added or now is None:
        return resolver.apply_file(change, now)[0]
    repo = resolver.repo
    current = repo.read_blobs([now[1]])[now[1]]
    applied = apply_hunks(current, change.hunks)
    if applied is not None:
        content = applied[0]
    else:
        images = repo.read_blobs([change.old_oid, change.new_oid], skip_missing=True)
        pre, post = images.get(change.old_oid), images.get(change.new_oid)
        if pre is None or post is None or (apply_hunks(pre, change.hunks) or (None,))[0] != post:
            return CONFLICTED
        merged = repo.merge_blobs(change.old_oid, now[1], change.new_oid)
        if merged is None:
            return CONFLICTED
        content = repo.read_blobs([merged])[merged]
    if content == current:
        return UNCHANGED
    return (change.new_mode if now[0] == change.old_mode else now[0], repo.write_blob(content))


@dataclass
class BuiltSources:
    """The overlay (over stock) that an entry's sources and vendored kernels give on its base."""

    overlay: dict[str, Entry | None]
    paths: list[str] = field(default_factory=list)  # fork paths the sources set (no vendored files)


def _patches(files: dict[str, bytes], entry_id: str, home: Home) -> dict[str, FileChange]:
    """The patches among ``files``, parsed: fork path -> its change. A patch holds one file, its own path."""
    changes = {}
    for rel, text in files.items():
        if not rel.startswith(PATCHES + "/"):
            continue
        where = str(home.entry_dir(entry_id) / rel)
        path = rel[len(PATCHES) + 1 : -len(PATCH_SUFFIX)] if rel.endswith(PATCH_SUFFIX) else None
        parsed = parse_delta(text, entry_id, where).changes if path else ()
        if path is None or len(parsed) != 1 or parsed[0].path != path:
            raise DeltaError(
                f"{rel} is not one file's patch at its own path",
                where=where,
                fix=f"a patch at patches/<fork path>.patch holds that file's section of delta.patch only; "
                f"run `specpilot-mem sources {entry_id}` to write the sources from the recorded delta",
            )
        changes[path] = parsed[0]
    return changes


def build_sources(
    resolver: Resolver, entry_id: str, requires: list[str], files: dict[str, bytes], vendored: dict[str, bytes]
) -> BuiltSources:
    """Lay ``files`` (sources, ``read_sources`` form) and ``vendored`` ({vendored path: bytes}) over stock +
    ``requires`` in memory, writing the blobs they need into the fork."""
    fork, repo = resolver.fork, resolver.repo
    prefix = fork.package_prefix
    base = resolver.base(fork.stock_tree)
    walk = resolver.walk(fork.stock_tree, resolver.chain(requires))
    overlay = dict(walk.overlay)

    def current(path: str) -> Entry | None:
        return overlay[path] if path in overlay else base.files.get(path)

    def put(path: str, content: bytes) -> None:
        now = current(prefix + path)
        overlay[prefix + path] = (now[0] if now else _REGULAR, repo.write_blob(content))

    whole = {rel[len(SRC) + 1 :]: content for rel, content in files.items() if rel.startswith(SRC + "/")}
    patches = _patches(files, entry_id, resolver.fork.home)
    for path, content in whole.items():
        put(path, content)
    for path, change in patches.items():
        if path in whole:
            continue  # a whole file resolves its patch by hand
        outcome = _apply_patch(resolver, change, current(prefix + path))
        if outcome is CONFLICTED:
            owners = ", ".join(walk.touched.get(prefix + path, []))
            raise ConflictError(
                f"{entry_id}'s patch of {path} does not apply to the file as its requirements leave it "
                + (f"(changed by {owners})" if owners else "(stock's version)"),
                where=str(resolver.fork.home.entry_dir(entry_id) / PATCHES / f"{path}{PATCH_SUFFIX}"),
                fix=f"write {entry_id}'s full version of the file over the new one at entries/{entry_id}/{SRC}/{path} "
                f"(it takes the patch's place), then record again; or rebuild it in a work tree "
                f"(`specpilot-mem apply {' '.join(requires) or entry_id} --worktree W`, edit, "
                f"`specpilot-mem record {entry_id} --from W`)",
            )
        if outcome is not UNCHANGED:
            overlay[prefix + path] = outcome
    for marker in package_markers(list(vendored)):
        if vendored and current(prefix + marker) is None:
            put(marker, b"")
    for path, content in vendored.items():
        put(path, content)
    return BuiltSources(overlay, sorted({*whole, *patches}))


def sources_tree(resolver: Resolver, entry_id: str, requires: list[str], files: dict[str, bytes], kernels) -> str:
    """The tree (written) that the entry's sources and the library's ``kernels`` (op folders or files under
    ``kernels/specpilot_kernels/``) give over stock + ``requires``."""
    vendored = library_files(resolver.fork.home, list(kernels)) if kernels else {}
    built = build_sources(resolver, entry_id, requires, files, vendored)
    base = resolver.base(resolver.fork.stock_tree)
    return overlay_tree_id(base, built.overlay, lambda c: resolver.repo.write_object("tree", c))


def source_problems(resolver: Resolver, entry_id: str, files: dict[str, bytes]) -> list[str]:
    """How ``files`` fail to describe what the entry's delta puts in the fork (every path outside the vendored
    kernels, byte for byte and mode for mode); empty when they do."""
    fork = resolver.fork
    prefix = fork.package_prefix
    record = resolver.records[entry_id]
    try:
        built = build_sources(resolver, entry_id, record.requires, files, {})
    except (ConflictError, DeltaError) as err:
        return [err.what]
    stock = resolver.base(fork.stock_tree).files
    applied = resolver.walk(fork.stock_tree, resolver.chain([entry_id])).overlay

    def want(path: str) -> Entry | None:
        return applied[path] if path in applied else stock.get(path)

    def got(path: str) -> Entry | None:
        return built.overlay[path] if path in built.overlay else stock.get(path)

    delta = resolver.delta(entry_id)
    own = [c.path for c in delta.changes if not c.path.startswith(VENDOR_DIR + "/")]
    problems = [
        f"{path} differs from what the delta puts in the fork"
        for path in built.paths
        if got(prefix + path) != want(prefix + path)
    ]
    problems += [f"{path} is in the delta but has no source" for path in own if path not in built.paths]
    return problems


def sources_state(resolver: Resolver, entry_id: str) -> str:
    """``current``; ``rewrite due`` (they build the entry's files, in another layout: ``specpilot-mem sources``
    writes them); or ``differ: ...`` (edited and not recorded, or damaged)."""
    files = read_sources(resolver.fork.home, entry_id)
    problems = source_problems(resolver, entry_id, files)
    if problems:
        return "differ: " + "; ".join(problems)
    return "current" if files == render_sources(resolver, entry_id) else "rewrite due"


def write_sources(home: Home, entry_id: str, files: dict[str, bytes]) -> bool:
    """Make the entry's ``src/`` and ``patches/`` hold exactly ``files``; each folder is built beside and moved
    into place in one rename. Returns whether anything changed."""
    if read_sources(home, entry_id) == files:
        return False
    folder = home.entry_dir(entry_id)
    scratch = Path(tempfile.mkdtemp(prefix=f".sources-{os.getpid()}-", dir=folder))
    try:
        for rel, content in files.items():
            target = scratch / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        for kind in (SRC, PATCHES):
            if (scratch / kind).is_dir():
                replace_folder(scratch / kind, folder / kind)
            elif (folder / kind).exists():
                shutil.rmtree(folder / kind)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return True


@dataclass
class SourcesReport:
    """One entry's sources before and after ``write_entry_sources``."""

    id: str
    status: str  # current | rewritten | would rewrite
    whole: list[str]  # fork paths kept whole under src/
    patches: list[str]  # fork paths kept as patches over the requirements
    converted: list[str]  # whole copies that became patches (a requirement changes them too)
    removed: list[str] = field(default_factory=list)  # other source files that are gone (e.g. stray patches)


def write_entry_sources(home: Home, ids: list[str] | None = None, check: bool = False) -> list[SourcesReport]:
    """Write every entry's sources (or ``ids``') from its recorded delta, in the layout of this module: the
    migration from whole copies, idempotent (a second run finds every entry current). All or nothing: every
    entry must reproduce its record and its present sources must describe what its delta puts in the fork
    (else nothing is written, and the error names each entry, file and the fix); the new sources must build
    the same files. ``check``: write nothing, report what would change."""
    from specpilot_mem.errors import RecordError, ReproductionError
    from specpilot_mem.store.fork import open_fork

    fork = open_fork(home)
    with fork.lock(shared=check):
        resolver = Resolver(fork)
        wanted = [i for i in resolver.chain(ids if ids is not None else resolver.records) if has_sources(home, i)]
        if ids is not None:
            missing = [i for i in ids if i not in wanted]
            if missing:
                raise RecordError(
                    f"{', '.join(missing)} {'keeps' if len(missing) == 1 else 'keep'} no sources",
                    where=", ".join(f"entries/{i}/{SRC}" for i in missing),
                    fix="name entries that have a src/ or patches/ folder, or leave the ids out for all of them",
                )
        resolver.prepare(wanted)
        problems, plans = {}, {}
        for entry_id in wanted:
            outcome = resolver.reproduce(entry_id)
            if not outcome.reproduced:
                problems[entry_id] = [
                    "its chain from stock does not give its record's tree (see `specpilot-mem verify`)"
                ]
                continue
            now = read_sources(home, entry_id)
            if found := source_problems(resolver, entry_id, now):
                problems[entry_id] = found
                continue
            new = render_sources(resolver, entry_id)
            if left := source_problems(resolver, entry_id, new):
                raise ReproductionError(
                    f"the new sources of {entry_id} do not build its files: {'; '.join(left)}",
                    where=f"entries/{entry_id}",
                    fix="report this: the store could not render its own delta",
                )
            plans[entry_id] = (now, new)
        if problems:
            raise RecordError(
                "sources that do not describe their entry's recorded delta: "
                + "; ".join(f"{i}: {', '.join(p)}" for i, p in problems.items()),
                where=", ".join(f"entries/{i}" for i in problems),
                fix="nothing was changed; record those entries from their sources first "
                f"(`specpilot-mem record {' '.join(problems)} --src`), or restore the files from git",
            )
        reports = []
        for entry_id, (now, new) in plans.items():
            whole = sorted(rel[len(SRC) + 1 :] for rel in new if rel.startswith(SRC + "/"))
            patches = sorted(rel[len(PATCHES) + 1 : -len(PATCH_SUFFIX)] for rel in new if rel.startswith(PATCHES + "/"))
            converted = sorted(p for p in patches if f"{SRC}/{p}" in now)
            removed = sorted(rel for rel in now if rel not in new and rel[len(SRC) + 1 :] not in converted)
            status = "current" if now == new else "would rewrite" if check else "rewritten"
            reports.append(SourcesReport(entry_id, status, whole, patches, converted, removed))
        if not check:
            for entry_id, (_now, new) in plans.items():
                write_sources(home, entry_id, new)
        return reports
