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
import shutil
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


def vendor_kernels(home: Home, worktree: str | Path, files: list[str], package_prefix: str = "") -> dict[str, str]:
    """Copy library kernel files into a fork work tree; returns {vendored path: sha256}.

    ``files`` are paths under ``kernels/specpilot_kernels/``: a file (``w12/gemm.py``) or an op folder
    (``w12``: every source and tuned-config file in it, ``_VENDORED_SUFFIXES``); ``cuda_extension.py`` brings
    the shared ``csrc/`` headers with it. Call it while building an entry's tip, then ``record`` the work tree;
    the record pins the same hashes.
    """
    root = Path(worktree) / package_prefix
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
    pins = {}
    for marker in _PACKAGE_MARKERS:
        target = root / marker
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"")
    for source in chosen:
        relative = source.relative_to(home.kernels).as_posix()
        vendored = f"{VENDOR_DIR}/{relative}"
        target = root / vendored
        target.parent.mkdir(parents=True, exist_ok=True)
        init = target.parent / "__init__.py"
        if not init.exists():
            init.write_bytes(b"")
        shutil.copyfile(source, target)
        pins[vendored] = hashlib.sha256(source.read_bytes()).hexdigest()
    return pins


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
