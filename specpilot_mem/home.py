"""The memory home: the project folder that holds ``entries/`` (and ``rounds/``, ``sglang-fork/``).

Found as ``--home DIR``, else ``$SPECPILOT_HOME``, else the nearest folder at or above the current
directory that holds ``entries/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specpilot_mem.errors import SpecPilotError


@dataclass(frozen=True)
class Home:
    root: Path

    @property
    def entries(self) -> Path:
        return self.root / "entries"

    @property
    def rounds(self) -> Path:
        return self.root / "rounds"

    @property
    def fork(self) -> Path:
        return self.root / "sglang-fork"

    @property
    def kernels(self) -> Path:
        return self.root / "kernels" / "specpilot_kernels"

    @property
    def registry(self) -> Path:
        return self.root / "registry.duckdb"

    @property
    def state(self) -> Path:
        """Machine-local state that is never committed (caches, locks, memo of resolved trees)."""
        return self.root / ".specpilot"

    def entry_dir(self, entry_id: str) -> Path:
        return self.entries / entry_id


def find_home(explicit: str | os.PathLike | None = None, cwd: Path | None = None) -> Home:
    if explicit is None:
        explicit = os.environ.get("SPECPILOT_HOME") or None
    if explicit is not None:
        root = Path(explicit).expanduser().resolve()
        if not (root / "entries").is_dir():
            raise SpecPilotError(
                f"{root} is not a SpecPilot memory home (it has no entries/ folder)",
                where="--home / SPECPILOT_HOME",
                fix=f"create it with `mkdir -p {root}/entries`, or point --home at a project checkout",
            )
        return Home(root)
    start = (cwd or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "entries").is_dir():
            return Home(folder)
    raise SpecPilotError(
        f"no memory home at or above {start}",
        where="current directory",
        fix="run inside a SpecPilot checkout (a folder with entries/), or pass --home DIR / set SPECPILOT_HOME",
    )
