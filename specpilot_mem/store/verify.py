"""``verify``: rebuild every entry's chain from stock through the resolver and compare with its record.

Stored branch tips are never trusted; the resolver's memo of prefix walks makes a memory of 140
entries cheap. Each entry also gets its branch checked (does ``entry/<id>`` hold the tree?), its
vendored kernels compared with the library, and its sources (``store.sources``) compared with its delta.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.home import Home
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.kernels import KernelState, kernel_status
from specpilot_mem.store.resolver import Resolver
from specpilot_mem.store.sources import has_sources, sources_state


@dataclass
class EntryCheck:
    id: str
    reproduces: str
    tree: str | None
    ok: bool
    problem: str | None = None
    branch: str = "missing"  # current | stale | missing
    kernels: list[KernelState] = field(default_factory=list)
    # current | rewrite due (right files, older layout: `specpilot-mem sources`) | differ: ... (edited, not
    # recorded) | None (the entry keeps no sources)
    sources: str | None = None

    @property
    def kernels_behind(self) -> list[str]:
        return [k.vendored for k in self.kernels if k.status != "current"]


def verify_memory(home: Home, on_progress=None) -> list[EntryCheck]:
    fork = open_fork(home)
    with fork.lock(shared=True):
        resolver = Resolver(fork)
        branch_trees = fork.repo.ref_trees("refs/heads/entry")
        try:
            ids = resolver.order(resolver.closure(resolver.records))
            resolver.prepare(ids)
        except SpecPilotError:
            ids = sorted(resolver.records)  # each entry then reports its own requirement or delta error
        checks = []
        for entry_id in ids:
            record = resolver.records[entry_id]
            check = EntryCheck(entry_id, record.reproduces, None, False)
            try:
                outcome = resolver.reproduce(entry_id)
                check.tree, check.ok = outcome.tree, bool(outcome.reproduced)
                if not check.ok:
                    check.problem = "the chain from stock gives another tree"
            except SpecPilotError as err:
                check.problem = f"{type(err).__name__}: {err.what}"
            tree = branch_trees.get(f"refs/heads/entry/{entry_id}")
            if tree:
                check.branch = "current" if tree == record.reproduces else "stale"
            check.kernels = kernel_status(home, record)
            if check.ok and has_sources(home, entry_id):
                check.sources = sources_state(resolver, entry_id)
            checks.append(check)
            if on_progress:
                on_progress()
        return checks
