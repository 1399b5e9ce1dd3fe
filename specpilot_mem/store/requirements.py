"""Requirement closure and the deterministic topological order (needs only the records).

Order: Kahn's algorithm taking the smallest available id first. For a requirement-closed set S its
last entry has no dependents in S and the order of S without it is exactly the prefix — the
property the resolver's prefix memo relies on.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from specpilot_mem.errors import RequirementError, UnknownEntryError
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord


def closure(records: Mapping[str, EntryRecord], ids: Iterable[str], home: Home | None = None) -> set[str]:
    """``ids`` and everything they require, transitively; unknown ids, missing requirements and
    cycles are errors (a cycle is printed)."""
    wanted = list(ids)
    for entry_id in wanted:
        if entry_id not in records:
            raise UnknownEntryError(
                f"unknown entry {entry_id!r}",
                where=str(home.entries) if home else "entries/",
                fix="known entries: " + (", ".join(sorted(records)) or "(none yet)"),
            )
    done: set[str] = set()
    stack: list[str] = []

    def visit(entry_id: str) -> None:
        if entry_id in done:
            return
        if entry_id in stack:
            cycle = stack[stack.index(entry_id) :] + [entry_id]
            raise RequirementError(
                "requirement cycle: " + " -> ".join(cycle),
                where=", ".join(f"entries/{c}/entry.yaml" for c in cycle[:-1]),
                fix="remove one of these requirements",
            )
        stack.append(entry_id)
        for req in records[entry_id].requires:
            if req not in records:
                raise RequirementError(
                    f"entry {entry_id!r} requires {req!r}, which the memory does not hold",
                    where=f"entries/{entry_id}/entry.yaml (requires)",
                    fix=f"record {req!r} first, or drop it from {entry_id}'s requires",
                )
            visit(req)
        stack.pop()
        done.add(entry_id)

    for entry_id in wanted:
        visit(entry_id)
    return done


def order(records: Mapping[str, EntryRecord], ids: Iterable[str]) -> list[str]:
    """Deterministic topological order of a requirement-closed set (smallest available id first)."""
    members = set(ids)
    waiting = {i: {r for r in records[i].requires if r in members} for i in members}
    dependents: dict[str, list[str]] = {i: [] for i in members}
    for entry_id, reqs in waiting.items():
        for req in reqs:
            dependents[req].append(entry_id)
    result: list[str] = []
    ready = [i for i, reqs in waiting.items() if not reqs]
    heapq.heapify(ready)
    while ready:
        current = heapq.heappop(ready)
        result.append(current)
        for other in dependents[current]:
            waiting[other].discard(current)
            if not waiting[other]:
                heapq.heappush(ready, other)
    return result


def chain(records: Mapping[str, EntryRecord], ids: Iterable[str], home: Home | None = None) -> list[str]:
    return order(records, closure(records, ids, home))
