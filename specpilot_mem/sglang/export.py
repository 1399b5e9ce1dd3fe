"""Export an applied tree as a complete, importable ``sglang`` package.

The fork holds SGLang's Python sources only: the wheel's compiled extensions are left out of stock.
``export_tree`` writes the applied tree's ``sglang/`` (with every kernel the entries vendored) and
restores the compiled files from the pinned wheel, each checked against the wheel's RECORD (sha256
and size), then writes ``specpilot-export.json``: the tree, the entries and the options it carries.

The export is built beside ``dest`` and moved into place at the end, so a failure leaves ``dest``
as it was. A folder that holds an earlier export is replaced; any other non-empty folder is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specpilot_mem.errors import ForkError, SpecPilotError
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord
from specpilot_mem.output import progress
from specpilot_mem.store.records import replace_folder

MANIFEST = "specpilot-export.json"
MANIFEST_FORMAT = 1
PACKAGE = "sglang"


def read_manifest(export_dir: Path) -> dict[str, Any]:
    path = Path(export_dir) / MANIFEST
    if not path.is_file():
        raise SpecPilotError(
            f"{export_dir} is not a SpecPilot export (no {MANIFEST})",
            where=str(export_dir),
            fix="create it with `specpilot-mem apply ID... --export DIR` or `specpilot-mem deploy export NAME DIR`",
        )
    return json.loads(path.read_text())


def _entry_records(fork, entries: Sequence[EntryRecord | str]) -> list[EntryRecord]:
    """The entries with their requirements, in the resolver's application order."""
    from specpilot_mem.store.resolver import Resolver

    resolver = Resolver(fork)
    return [resolver.records[i] for i in resolver.chain(e.id if isinstance(e, EntryRecord) else e for e in entries)]


def _check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or (any(dest.iterdir()) and not (dest / MANIFEST).is_file())):
        raise SpecPilotError(
            f"{dest} exists and is not an earlier SpecPilot export",
            where=str(dest),
            fix="choose a new folder, or remove it first",
        )


def _write_sources(repo, tree_id: str, prefix: str, root: Path, show_progress: bool) -> int:
    """Write ``<prefix>sglang/`` of ``tree_id`` under ``root/sglang``; returns the number of files."""
    package = f"{prefix}{PACKAGE}/"
    rows = [
        (mode, oid, path)
        for mode, kind, oid, path in repo.ls_tree(tree_id)
        if kind == "blob" and path.startswith(package)
    ]
    if not rows:
        raise ForkError(
            f"tree {tree_id} has no {package} package",
            where=str(repo.path),
            fix="export a tree of the SGLang fork (stock, an entry, or a deployment branch)",
        )
    blobs = repo.read_blobs(oid for _, oid, _ in rows)
    with progress("writing sources", len(rows), enabled=show_progress) as bar:
        for mode, oid, path in rows:
            target = root / PACKAGE / path[len(package) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            if mode == "120000":
                os.symlink(blobs[oid].decode(), target)
            else:
                target.write_bytes(blobs[oid])
                if mode == "100755":
                    target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            bar.advance()
    return len(rows)


def _restore_compiled(wheel_path: Path, root: Path) -> dict[str, str]:
    """Extract the wheel's compiled files under ``sglang/`` (checked against RECORD); path -> sha256."""
    from specpilot_mem.store.stock import read_record

    restored: dict[str, str] = {}
    with zipfile.ZipFile(wheel_path) as wheel:
        record = read_record(wheel)
        for info in wheel.infolist():
            name = info.filename
            if not (name.startswith(f"{PACKAGE}/") and name.endswith(".so")):
                continue
            payload = wheel.read(info)
            row = record.get(name)
            if row is None or hashlib.sha256(payload).hexdigest() != row.sha256 or len(payload) != row.size:
                raise ForkError(
                    f"{name} in {wheel_path.name} does not match the wheel's RECORD",
                    where=str(wheel_path),
                    fix="the wheel is damaged: delete it and run `specpilot-mem init` again to re-download it",
                )
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(payload)
            target.chmod(0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
            restored[name] = row.sha256
    return restored


def export_tree(
    home: Home,
    tree_id: str,
    dest: str | os.PathLike,
    entries: Sequence[EntryRecord | str],
    *,
    wheel: str | os.PathLike | None = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Write ``tree_id`` of the fork as an importable ``sglang`` package under ``dest``; return the manifest.

    ``entries`` are the entries applied in that tree (ids or records); the manifest lists them with
    their requirements, in application order, each with its options, so ``serve`` can tell which flags
    the export understands.
    """
    from specpilot_mem.store.fork import open_fork
    from specpilot_mem.store.stock import SGLANG_VERSION, fetch_wheel

    dest = Path(dest).expanduser().resolve()
    _check_dest(dest)
    fork = open_fork(home)
    resolved = fork.repo.rev_parse(f"{tree_id}^{{tree}}")
    if resolved is None:
        raise ForkError(
            f"{tree_id} is not a tree, commit or branch of the fork",
            where=str(fork.repo.path),
            fix="pass the tree id that `specpilot-mem apply --json` printed, or a deployment branch",
        )
    records = _entry_records(fork, entries)
    wheel_path = fetch_wheel(wheel)

    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = dest.parent / f".{dest.name}.export-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        files = _write_sources(fork.repo, resolved, fork.package_prefix, scratch, show_progress)
        compiled = _restore_compiled(wheel_path, scratch)
        options = {o.name: o.default for record in records for o in record.options}
        manifest = {
            "format": MANIFEST_FORMAT,
            "sglang_version": SGLANG_VERSION,
            "tree": resolved,
            "source_files": files,
            "compiled_files": compiled,
            "entries": [
                {
                    "id": r.id,
                    "reproduces": r.reproduces,
                    "options": [o.model_dump(mode="json", exclude_none=True) for o in r.options],
                    "kernels": dict(r.kernels),
                }
                for r in records
            ],
            "options": options,
        }
        (scratch / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        replace_folder(scratch, dest)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return manifest


def cached_export(
    home: Home, revision: str, entries: Sequence[EntryRecord | str] = (), *, show_progress: bool = False
) -> Path:
    """An export of ``revision`` under ``<home>/.specpilot/exports/<tree id>``, written once per tree."""
    from specpilot_mem.store.fork import open_fork

    fork = open_fork(home)
    tree = fork.repo.rev_parse(f"{revision}^{{tree}}")
    if tree is None:
        raise ForkError(
            f"the fork has no revision {revision!r}",
            where=str(fork.repo.path),
            fix="pass a branch, commit or tree id of sglang-fork",
        )
    dest = home.state / "exports" / tree
    if not (dest / MANIFEST).is_file() or read_manifest(dest)["tree"] != tree:
        export_tree(home, tree, dest, entries, show_progress=show_progress)
    return dest
