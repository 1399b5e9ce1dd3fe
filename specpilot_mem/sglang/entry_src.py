"""SGLang entries kept as reviewable files: ``entries/<id>/src/`` (whole files) and ``patches/`` (the entry's
change to a file a requirement changes too), laid out by ``specpilot_mem.store.sources``.

``build_entry`` records an entry from those files over its base (stock with its requirements applied),
vendoring the kernels it names from ``kernels/specpilot_kernels/``; ``rebuild_entry`` re-records one or
several existing entries from them (``record ID... --src``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord


def sglang_entry_ids(home: Home) -> list[str]:
    """Recorded entries whose SGLang files live under ``entries/<id>/`` as sources."""
    from specpilot_mem.store.records import load_entries
    from specpilot_mem.store.sources import has_sources

    return sorted(i for i in load_entries(home) if has_sources(home, i))


def build_entry(
    home: Home,
    entry_id: str,
    requires: Sequence[str],
    meta: str | Path | dict | None = None,
    kernels: Sequence[str] = (),
) -> EntryRecord:
    """Record ``entry_id`` from its sources (plus vendored ``kernels``) on top of ``requires``."""
    from specpilot_mem.store.record import record_sources

    return record_sources(home, [entry_id], requires=list(requires), meta=meta, kernels=list(kernels))[0]


def rebuild_entry(home: Home, *ids: str) -> list[EntryRecord]:
    """Re-record ``ids`` from their sources and the current kernel library as one change, keeping each record's
    requirements, metadata (evidence included: edit the YAML first) and vendored kernel folders."""
    from specpilot_mem.store.record import record_sources

    return record_sources(home, list(ids))
