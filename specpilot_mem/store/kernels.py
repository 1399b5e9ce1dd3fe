"""Vendoring kernels from the living library into the fork, and checking vendored copies.

Library file ``kernels/specpilot_kernels/<op>/<file>`` is vendored byte for byte to
``<package prefix>sglang/srt/specpilot/kernels/<op>/<file>`` (as SGLang vendors flash-linear-attention
under ``kernels/ops/attention/fla``), so an applied tree is self-contained and reproduction covers it.
Because the bytes are unchanged, a vendored kernel module must import its siblings relatively
(``from .reference import ...``), never through ``specpilot_kernels``. ``record`` pins each vendored
file's sha256 in the record's ``kernels``; ``kernel_status`` reports copies behind the library.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord

VENDOR_DIR = "sglang/srt/specpilot/kernels"
# A library file vendored with the folder it depends on: the CUDA extension loader puts the library's shared
# headers (csrc/, e.g. pdl.cuh) on every extension's include path, so they travel with it.
_COMPANIONS = {"cuda_extension.py": "csrc"}
# What an op folder's vendoring takes: its sources and its tuned configs (w12/mma_configs.json: the partitions
# tuned per GPU, which the vendored kernels read beside themselves).
_VENDORED_SUFFIXES = {".py", ".cu", ".cuh", ".cpp", ".json"}
# Package markers the vendoring creates when missing (empty, so two entries adding them agree).
_PACKAGE_MARKERS = ("sglang/srt/specpilot/__init__.py", f"{VENDOR_DIR}/__init__.py")


def library_path(home: Home, vendored: str) -> Path:
    """The library file a vendored path was copied from."""
    return home.kernels / vendored[len(VENDOR_DIR) + 1 :]


def library_files(home: Home, files: list[str]) -> dict[str, bytes]:
    """{vendored path: bytes} of the library files ``files`` name (paths under ``kernels/specpilot_kernels/``: a
    file such as ``w12/gemm.py``, or an op folder such as ``w12``: every source and tuned-config file in it,
    ``_VENDORED_SUFFIXES``); ``cuda_extension.py`` brings the shared ``csrc/`` headers with it."""
    chosen: list[Path] = []
    names = list(files) + [
        _COMPANIONS[name] for name in files if name in _COMPANIONS and (home.kernels / _COMPANIONS[name]).is_dir()
    ]
    for name in dict.fromkeys(names):
        source = home.kernels / name
        if source.is_dir():
            chosen += sorted(
                p
                for p in source.rglob("*")
                if p.is_file() and p.suffix in _VENDORED_SUFFIXES and "__pycache__" not in p.parts
            )
        elif source.is_file():
            chosen.append(source)
        else:
            raise SpecPilotError(
                f"no kernel file or op folder {name!r} in the library",
                where=str(home.kernels),
                fix="name a path under kernels/specpilot_kernels/, e.g. w12 or w12/gemm.py",
            )
    return {f"{VENDOR_DIR}/{source.relative_to(home.kernels).as_posix()}": source.read_bytes() for source in chosen}


def package_markers(vendored: list[str]) -> list[str]:
    """The empty ``__init__.py`` files vendoring ``vendored`` creates where missing (so two entries adding
    them agree): the package markers and one in each folder of a vendored file."""
    folders = {path.rpartition("/")[0] for path in vendored}
    return list(dict.fromkeys([*_PACKAGE_MARKERS, *(f"{folder}/__init__.py" for folder in sorted(folders))]))


def vendor_kernels(home: Home, worktree: str | Path, files: list[str], package_prefix: str = "") -> dict[str, str]:
    """Copy library kernel files (``library_files``) into a fork work tree; returns {vendored path: sha256}.

    Call it while building an entry's tip, then ``record`` the work tree; the record pins the same hashes.
    """
    root = Path(worktree) / package_prefix
    copies = library_files(home, files)
    for marker in package_markers(list(copies)):
        target = root / marker
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"")
    for vendored, content in copies.items():
        (root / vendored).write_bytes(content)
    return {vendored: hashlib.sha256(content).hexdigest() for vendored, content in copies.items()}


def vendored_sources(record: EntryRecord) -> list[str]:
    """What rebuilding ``record`` from its sources vendors: each op folder it vendors (whole, so files added
    to the op since are taken too) and each top-level library file (e.g. ``cuda_extension.py``)."""
    return sorted({path[len(VENDOR_DIR) + 1 :].split("/")[0] for path in record.kernels})


@dataclass
class KernelState:
    entry: str
    vendored: str
    library: str
    pinned: str
    current: str | None  # sha256 of the library file now; None if it was removed

    @property
    def status(self) -> str:
        if self.current is None:
            return "removed from library"
        return "current" if self.current == self.pinned else "behind library"


def kernel_status(home: Home, record: EntryRecord) -> list[KernelState]:
    states = []
    for vendored, pinned in sorted(record.kernels.items()):
        library = library_path(home, vendored)
        current = hashlib.sha256(library.read_bytes()).hexdigest() if library.is_file() else None
        states.append(KernelState(record.id, vendored, str(library.relative_to(home.root)), pinned, current))
    return states
