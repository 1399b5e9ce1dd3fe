"""Property tests over random requirement DAGs on a small synthetic fork (user-fork mode, python/ prefix)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_support import DRAFT, fork_file, prefixed_source, set_slot, slotted, synthetic_home

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.store import record_entry
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import Resolver, apply_entries
from specpilot_mem.store.verify import verify_memory


@st.composite
def dags(draw):
    """requires[i] for entries e0..e{n-1}, each requiring only earlier ones."""
    n = draw(st.integers(2, 5))
    return [sorted(draw(st.sets(st.integers(0, i - 1), max_size=2))) if i else [] for i in range(n)]


def build(home, requires):
    """Entry e<i>: sets slot i of the shared file (3-way merges with siblings), adds its own slotted file,
    and sets slot i in each required entry's file (pre-images that only exist after the requirement)."""
    for i, reqs in enumerate(requires):
        req_ids = [f"e{r}" for r in reqs]
        files = {
            "sglang/shared.py": set_slot(fork_file(home, req_ids, "sglang/shared.py"), "shared", i, f"e{i}"),
            f"sglang/e{i}.py": slotted(f"e{i}"),
        }
        for r in reqs:
            files[f"sglang/e{r}.py"] = set_slot(fork_file(home, req_ids, f"sglang/e{r}.py"), f"e{r}", i, f"e{i}")
        record_entry(home, f"e{i}", prefixed_source(home, req_ids, files), requires=req_ids, meta=DRAFT)


def random_topological_order(resolver, ids, rng):
    members, order = set(resolver.closure(ids)), []
    while members:
        ready = sorted(i for i in members if not set(resolver.records[i].requires) & members)
        choice = rng.choice(ready)
        order.append(choice)
        members.remove(choice)
    return order


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requires=dags(), subset_seed=st.integers(0, 2**16))
def test_random_dags(tmp_path_factory, requires, subset_seed):
    home = synthetic_home(tmp_path_factory.mktemp("dag"))
    build(home, requires)
    ids = [f"e{i}" for i in range(len(requires))]

    # reproduction holds for every recorded entry, rebuilt from stock
    assert all(check.ok for check in verify_memory(home))

    # the same closure gives the same tree whatever the order the entries are named or applied in
    rng = random.Random(subset_seed)
    chosen = rng.sample(ids, rng.randint(1, len(ids)))
    reference = apply_entries(home, sorted(chosen)).tree
    assert apply_entries(home, list(reversed(chosen))).tree == reference
    fork = open_fork(home)
    resolver = Resolver(fork)
    for _ in range(3):
        order = random_topological_order(resolver, chosen, rng)
        assert resolver.tree_id(fork.stock_tree, resolver.walk(fork.stock_tree, order)) == reference

    # every failure leaves refs untouched
    refs = fork.repo.refs("refs")
    for bad in (chosen + ["missing"], ["e0", "e0-x"]):
        with pytest.raises(SpecPilotError):
            apply_entries(home, bad, branch="deploy/bad")
    (home.entries / ids[-1] / "delta.patch").write_bytes(b"diff --git a/x b/x\nindex 12\n")
    with pytest.raises(SpecPilotError):
        apply_entries(home, ids, branch="deploy/bad")
    assert fork.repo.refs("refs") == refs


def test_user_fork_keeps_files_outside_the_prefix_and_checks_its_own_stock(tmp_path):
    home = synthetic_home(tmp_path)
    fork = open_fork(home)
    assert not fork.pinned and fork.package_prefix == "python/"
    build(home, [[], [0]])
    result = apply_entries(home, ["e1"], branch="deploy/mine")
    assert fork.repo.out("cat-file", "blob", "deploy/mine:README.md") == "my fork"
    assert "e1 slot 0" in fork.repo.out("cat-file", "blob", "deploy/mine:python/sglang/e1.py")
    assert [o.reproduced for o in result.outcomes] == [True, True]
    delta = (home.entries / "e1" / "delta.patch").read_text()
    assert "a/sglang/e0.py" in delta and "python/" not in delta  # deltas are relative to the package


def test_worktree_output_and_dirty_target(tmp_path):
    home = synthetic_home(tmp_path)
    build(home, [[]])
    worktree = tmp_path / "wt"
    result = apply_entries(home, ["e0"], worktree=str(worktree))
    assert (worktree / "python/sglang/e0.py").read_bytes() == slotted("e0")
    assert result.worktree == str(worktree)
    (worktree / "python/sglang/e0.py").write_text("edited\n")
    with pytest.raises(SpecPilotError, match="uncommitted changes"):
        apply_entries(home, ["e0"], worktree=str(worktree))
    # recording from the work tree takes its uncommitted edit, but not what importing it left behind
    (worktree / "python/sglang/__pycache__").mkdir()
    (worktree / "python/sglang/__pycache__/e0.cpython-311.pyc").write_bytes(b"\0compiled")
    record = record_entry(home, "edited", str(worktree), requires=["e0"], meta=DRAFT)
    assert record.source.commit is None
    assert "edited" in open_fork(home).repo.out("cat-file", "blob", "entry/edited:python/sglang/e0.py")
    assert "__pycache__" not in (home.entries / "edited" / "delta.patch").read_text()
