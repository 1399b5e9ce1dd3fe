"""Entries may not add symlinks that point outside the tree: record refuses them, apply --export never
writes one out."""

from __future__ import annotations

import pytest
from test_store_support import DRAFT, synthetic_home

from specpilot_mem.errors import DeltaError
from specpilot_mem.store import record as record_module
from specpilot_mem.store import record_entry
from specpilot_mem.store.delta import check_symlink
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import apply_entries


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return synthetic_home(tmp_path_factory.mktemp("links"))


def _with_link(home, name: str, target: bytes) -> str:
    fork = open_fork(home)
    repo = fork.repo
    with repo.temporary_index() as env:
        repo.git("read-tree", fork.stock_commit, env=env)
        oid = repo.write_blob(target)
        repo.git("update-index", "--add", "--cacheinfo", f"120000,{oid},python/sglang/{name}", env=env)
        tree = repo.out("write-tree", env=env)
    return repo.out("commit-tree", tree, "-p", fork.stock_commit, "-m", "link")


@pytest.mark.parametrize("target", [b"/etc/passwd", b"../../../outside", b"srt/../../../../x", b"C:/x"])
def test_record_refuses_a_symlink_out_of_the_tree(home, target):
    entries = sorted(p.name for p in home.entries.iterdir())
    with pytest.raises(DeltaError, match="points outside the tree"):
        record_entry(home, "escape", _with_link(home, "srt/evil", target), requires=[], meta=DRAFT)
    assert sorted(p.name for p in home.entries.iterdir()) == entries


def test_a_symlink_inside_the_tree_is_fine(home):
    record_entry(home, "inside", _with_link(home, "srt/alias.py", b"../shared.py"), requires=[], meta=DRAFT)
    check_symlink("a/b/c", b"../../x", "here")  # climbs to the root, not above it


def test_export_never_writes_an_escaping_symlink(home, tmp_path, monkeypatch):
    monkeypatch.setattr(record_module, "check_symlinks", lambda *args: None)  # a record from before the check
    record_entry(home, "old-escape", _with_link(home, "evil", b"/etc/passwd"), requires=[], meta=DRAFT)
    monkeypatch.undo()
    with pytest.raises(DeltaError, match="points outside the tree"):
        apply_entries(home, ["old-escape"], export=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
