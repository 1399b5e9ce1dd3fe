"""Entries as branches: ``entry/<id>`` with deterministic commits, rebuilt from the records and deltas.

TopGit style: an entry's base is the merge of its requirements (a commit whose parents are stock and
each required entry's tip, whose tree is the resolver's result), or stock itself when it requires
nothing; its tip is one commit on that base whose tree is the entry's ``reproduces``. Identity and
dates are fixed (dates from the record's ``recorded``), so the same memory gives the same commit ids
everywhere. All branch moves happen in one ``update-ref`` transaction at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.git import commit_content
from specpilot_mem.store.fork import ENTRY_REF_PREFIX
from specpilot_mem.store.resolver import Resolver, commit_date


@dataclass
class BranchState:
    id: str
    ref: str
    commit: str | None  # None: the branch was deleted (its entry is gone) or could not be built
    change: str  # created | updated | unchanged | deleted | failed
    problem: str | None = None


def entry_commits(resolver: Resolver, entry_id: str, tips: dict[str, str]) -> tuple[str, str]:
    """(base commit, tip commit) of one entry; ``tips`` holds its requirements' tips already."""
    record = resolver.records[entry_id]
    fork = resolver.fork
    stock = fork.stock_tree
    if record.requires:
        walk = resolver.walk(stock, resolver.chain(record.requires))
        base_tree = resolver.tree_id(stock, walk, write=True)
        message = f"base of {entry_id}: stock + {' + '.join(record.requires)}"
        base = resolver.repo.write_object(
            "commit",
            commit_content(
                base_tree,
                [fork.stock_commit] + [tips[r] for r in record.requires],
                message,
                commit_date(resolver.records[r] for r in resolver.chain(record.requires)),
            ),
        )
    else:
        base = fork.stock_commit
    walk = resolver.walk(stock, resolver.chain([entry_id]))
    tip_tree = resolver.tree_id(stock, walk, write=True)
    message = f"{entry_id}: {record.title}\n\nreproduces {record.reproduces}"
    tip = resolver.repo.write_object("commit", commit_content(tip_tree, [base], message, commit_date([record])))
    return base, tip


def plan_branches(
    resolver: Resolver, only: set[str] | None = None
) -> tuple[dict[str, tuple[str | None, str | None]], list[BranchState]]:
    """The ref updates that make ``entry/*`` match the memory, and what happens to each branch.

    An entry whose chain does not reproduce its record (or whose delta is damaged) gets no branch
    update and is reported ``failed``; its dependents fail with it. With ``only``, the other entries
    keep their existing branches (rebuilt only where one is missing).
    """
    existing = resolver.repo.refs(ENTRY_REF_PREFIX.rstrip("/"))
    updates: dict[str, tuple[str | None, str | None]] = {}
    states: list[BranchState] = []
    tips: dict[str, str] = {}
    for entry_id in resolver.order(resolver.closure(resolver.records)):
        ref = ENTRY_REF_PREFIX + entry_id
        old = existing.get(ref)
        broken = [r for r in resolver.records[entry_id].requires if r not in tips]
        if only is not None and entry_id not in only and old and not broken:
            tips[entry_id] = old
            continue
        if broken:
            states.append(BranchState(entry_id, ref, old, "failed", f"requires {', '.join(broken)}, which failed"))
            continue
        try:
            outcome = resolver.reproduce(entry_id)
            if not outcome.reproduced:
                raise SpecPilotError(f"its chain gives tree {outcome.tree}, the record says {outcome.reproduces}")
            _base, tip = entry_commits(resolver, entry_id, tips)
        except SpecPilotError as err:
            states.append(BranchState(entry_id, ref, old, "failed", err.what))
            continue
        tips[entry_id] = tip
        change = "unchanged" if old == tip else ("updated" if old else "created")
        if old != tip:
            updates[ref] = (old, tip)
        states.append(BranchState(entry_id, ref, tip, change))
    for ref, old in sorted(existing.items()):
        entry_id = ref[len(ENTRY_REF_PREFIX) :]
        if entry_id not in resolver.records and only is None:
            updates[ref] = (old, None)
            states.append(BranchState(entry_id, ref, None, "deleted"))
    return updates, states


def sync_branches(resolver: Resolver, only: set[str] | None = None) -> list[BranchState]:
    updates, states = plan_branches(resolver, only)
    resolver.repo.update_refs(updates, "specpilot: entry branches from entries/")
    return states
