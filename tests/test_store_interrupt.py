"""Ctrl-C during apply --worktree or --export leaves nothing half-written; a leftover of an older crash
is named, with the command that removes it."""

from __future__ import annotations

import pytest
from test_store_support import DRAFT, append_line, source_on

from specpilot_mem.errors import ForkError
from specpilot_mem.git import Repo
from specpilot_mem.store import record_entry
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import apply_entries

SERVER_ARGS = "sglang/srt/server_args.py"
GONE_PID = 999_999_999  # above any pid_max


@pytest.fixture
def memory(stock_home_copy):
    home = stock_home_copy
    record_entry(
        home,
        "alpha",
        source_on(home, [], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# alpha")}),
        requires=[],
        meta=DRAFT,
    )
    return home


def _interrupt_at(monkeypatch, *words):
    real = Repo.git

    def git(self, *args, **kwargs):
        if args[: len(words)] == words:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Repo, "git", git)


def _worktrees(home) -> list[str]:
    return [
        line
        for line in open_fork(home).repo.out("worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


def test_ctrl_c_during_a_new_worktree_leaves_nothing(memory, tmp_path, monkeypatch):
    before = _worktrees(memory)
    _interrupt_at(monkeypatch, "worktree", "move")  # after the checkout was built beside
    with pytest.raises(KeyboardInterrupt):
        apply_entries(memory, ["alpha"], worktree=str(tmp_path / "wt"))
    assert not (tmp_path / "wt").exists() and list(tmp_path.glob(".wt.*")) == []
    assert _worktrees(memory) == before


def test_ctrl_c_while_replacing_a_worktree_keeps_the_old_one(memory, tmp_path, monkeypatch):
    tmp_path = tmp_path / "trees"  # the home lies in tmp_path itself
    first = apply_entries(memory, ["alpha"], worktree=str(tmp_path / "wt"))
    head = Repo(tmp_path / "wt").out("rev-parse", "HEAD")
    real = Repo.git
    moves = []

    def git(self, *args, **kwargs):
        if args[:2] == ("worktree", "move"):
            moves.append(args)
            if len(moves) == 2:  # the old one is aside, the new one not yet in place
                raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Repo, "git", git)
    with pytest.raises(KeyboardInterrupt):
        apply_entries(memory, ["alpha"], onto=first.commit, worktree=str(tmp_path / "wt"))
    monkeypatch.setattr(Repo, "git", real)
    assert Repo(tmp_path / "wt").out("rev-parse", "HEAD") == head
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wt"]


def test_a_leftover_worktree_or_export_is_named_with_its_removal(memory, tmp_path):
    for kind in ("worktree", "export"):
        leftover = tmp_path / f".out.{kind}-{GONE_PID}"
        leftover.mkdir()
        target = {"worktree": str(tmp_path / "out")} if kind == "worktree" else {"export": str(tmp_path / "out")}
        with pytest.raises(ForkError) as err:
            apply_entries(memory, ["alpha"], **target)
        assert str(leftover) in err.value.what and f"rm -rf {leftover}" in err.value.fix
        assert not (tmp_path / "out").exists()
        leftover.rmdir()


def test_a_file_where_the_worktree_should_go_is_a_clear_error(memory, tmp_path):
    (tmp_path / "wt").write_text("a file")
    with pytest.raises(ForkError, match="exists and is not a work tree of the fork"):
        apply_entries(memory, ["alpha"], worktree=str(tmp_path / "wt"))


def test_ctrl_c_during_an_export_leaves_nothing(memory, tmp_path, monkeypatch):
    from specpilot_mem.sglang import export as export_module

    def interrupted(built, dest):
        raise KeyboardInterrupt  # everything is written beside the destination, the rename has not happened

    monkeypatch.setattr(export_module, "replace_folder", interrupted)
    out = tmp_path / "exports" / "out"
    with pytest.raises(KeyboardInterrupt):
        apply_entries(memory, ["alpha"], export=str(out))
    assert not out.exists() and list(out.parent.iterdir()) == []
