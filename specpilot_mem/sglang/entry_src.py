"""SGLang entries kept as reviewable files: ``entries/<id>/src/`` mirrors the fork's paths.

Every file an SGLang-side entry adds or changes lives in full under ``entries/<id>/src/`` (e.g.
``entries/options/src/sglang/srt/arg_groups/fields/specpilot.py``), so it can be read, tested and
diffed against stock. ``build_entry`` lays those files over the entry's base (stock with its
requirements applied), vendors the kernels it names from ``kernels/specpilot_kernels/`` and records
the work tree through the memory store, which writes the delta and pins ``reproduces``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord


def sglang_entry_ids(home: Home) -> list[str]:
    """Recorded entries whose SGLang files live under ``entries/<id>/src/``."""
    from specpilot_mem.store.records import load_entries

    return sorted(i for i in load_entries(home) if src_dir(home, i).is_dir())


def src_dir(home: Home, entry_id: str) -> Path:
    return home.entry_dir(entry_id) / "src"


def src_files(home: Home, entry_id: str) -> dict[str, Path]:
    """Fork path -> file under ``entries/<id>/src/`` (caches left out)."""
    root = src_dir(home, entry_id)
    if not root.is_dir():
        raise SpecPilotError(
            f"entry {entry_id} has no source files",
            where=str(root),
            fix="put the files the entry adds or changes there, at their fork paths",
        )
    return {
        p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def build_entry(
    home: Home,
    entry_id: str,
    requires: Sequence[str],
    meta: str | Path | dict | None = None,
    kernels: Sequence[str] = (),
) -> EntryRecord:
    """Record ``entry_id`` from its ``src/`` files (plus vendored ``kernels``) on top of ``requires``."""
    from specpilot_mem.store.fork import open_fork
    from specpilot_mem.store.kernels import vendor_kernels
    from specpilot_mem.store.record import record_entry
    from specpilot_mem.store.resolver import apply_entries

    files = src_files(home, entry_id)
    fork = open_fork(home)
    home.state.mkdir(parents=True, exist_ok=True)
    worktree = Path(tempfile.mkdtemp(prefix=f"build-{entry_id}-", dir=home.state)) / "tree"
    try:
        if requires:
            apply_entries(home, list(requires), worktree=str(worktree))
        else:
            fork.repo.git("worktree", "add", "--quiet", "--detach", str(worktree), fork.stock_commit)
        for path, source in files.items():
            target = worktree / fork.package_prefix / path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        if kernels:
            vendor_kernels(home, worktree, list(kernels), fork.package_prefix)
        return record_entry(home, entry_id, str(worktree), list(requires), meta)
    finally:
        fork.repo.git("worktree", "remove", "--force", str(worktree), check=False)
        shutil.rmtree(worktree.parent, ignore_errors=True)


def vendored_sources(record: EntryRecord) -> list[str]:
    """What ``build_entry`` vendors to rebuild ``record``: each op folder it vendors (whole, so files added
    to the op since are taken too) and each top-level library file (e.g. ``cuda_extension.py``)."""
    from specpilot_mem.store.kernels import VENDOR_DIR

    return sorted({path[len(VENDOR_DIR) + 1 :].split("/")[0] for path in record.kernels})


def rebuild_entry(home: Home, entry_id: str) -> EntryRecord:
    """Re-record ``entry_id`` from ``entries/<id>/src/`` and the current kernel library, keeping its record's
    requirements, metadata (evidence included: edit the YAML first) and vendored kernels."""
    from specpilot_mem.store.record import _STORE_FIELDS
    from specpilot_mem.store.records import load_entry

    record = load_entry(home, entry_id)
    src_files(home, entry_id)  # an entry without src/ is refused before any work
    meta = {
        k: v
        for k, v in record.model_dump(mode="json", exclude_none=True).items()
        if k not in _STORE_FIELDS or k == "id"
    }
    if record.options:  # an option's default of None (unset reproduces stock) is a value, not an absent field
        meta["options"] = [
            {**option.model_dump(mode="json", exclude_none=True), "default": option.default}
            for option in record.options
        ]
    return build_entry(home, entry_id, record.requires, meta=meta, kernels=vendored_sources(record))
