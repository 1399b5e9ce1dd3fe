"""Every failure is a clear error that changes nothing: refs, records and deltas stay as they were."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_store_support import DRAFT, append_line, source_on

from specpilot_mem.errors import DeltaError, ForkError, LockTimeout, RecordError, RequirementError, UnknownEntryError
from specpilot_mem.store import record_entry
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import apply_entries
from specpilot_mem.store.verify import verify_memory

SERVER_ARGS = "sglang/srt/server_args.py"


@pytest.fixture
def memory(stock_home_copy):
    """alpha, and beta requiring it, recorded on the real stock."""
    home = stock_home_copy
    record_entry(
        home,
        "alpha",
        source_on(home, [], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# alpha")}),
        requires=[],
        meta=DRAFT,
    )
    record_entry(
        home,
        "beta",
        source_on(home, ["alpha"], {"sglang/srt/specpilot/beta.py": b"B = 1\n"}),
        requires=["alpha"],
        meta=DRAFT,
    )
    return home


def snapshot(home):
    files = {p.relative_to(home.root): p.read_bytes() for p in sorted(home.entries.rglob("*")) if p.is_file()}
    return files, open_fork(home).repo.refs("refs")


def edit(home, entry_id, old, new, name="entry.yaml"):
    path = home.entries / entry_id / name
    path.write_bytes(path.read_bytes().replace(old, new))


def test_unknown_id(memory):
    before = snapshot(memory)
    with pytest.raises(UnknownEntryError, match="unknown entry 'gamma'") as err:
        apply_entries(memory, ["beta", "gamma"], branch="deploy/x")
    assert "alpha, beta" in err.value.fix and snapshot(memory) == before


def test_cycle_is_printed(memory):
    edit(memory, "alpha", b"title:", b"requires:\n- beta\ntitle:")
    before = snapshot(memory)
    with pytest.raises(RequirementError, match=r"requirement cycle: (alpha -> beta -> alpha|beta -> alpha -> beta)"):
        apply_entries(memory, ["beta"], branch="deploy/x")
    assert snapshot(memory) == before


def test_missing_requirement(memory):
    edit(memory, "beta", b"- alpha", b"- ghost")
    with pytest.raises(RequirementError, match="requires 'ghost', which the memory does not hold"):
        apply_entries(memory, ["beta"])


def test_malformed_record_names_the_line(memory):
    edit(memory, "alpha", b"title: test entry", b"title: [broken")
    with pytest.raises(RecordError, match="malformed YAML") as err:
        apply_entries(memory, ["alpha"])
    assert "entries/alpha/entry.yaml:" in err.value.where


@pytest.mark.parametrize(
    "old, new, message",
    [
        (b"+# alpha\n", b"+# alphA\n", "comes out as"),  # a flipped byte in a hunk: caught by git apply's result
        (b"+# alpha\n", b"", "cut short"),  # truncated
        (b"a/sglang/srt/server_args.py b/sglang/srt/server_args.py", b"a/.git/config b/.git/config", "inside .git"),
        (b"a/sglang/srt/server_args.py b/sglang/srt/server_args.py", b"a/../x.py b/../x.py", "outside the tree"),
    ],
)
def test_damaged_deltas(memory, old, new, message):
    edit(memory, "alpha", old, new, name="delta.patch")
    before = snapshot(memory)
    with pytest.raises(DeltaError, match=message):
        apply_entries(memory, ["beta"], branch="deploy/x")
    assert snapshot(memory) == before


def test_stock_that_moved_is_refused(memory):
    fork = open_fork(memory)
    fork.repo.git("update-ref", "refs/heads/stock", fork.repo.rev_parse("entry/alpha"))
    with pytest.raises(ForkError, match="not the pinned stock"):
        apply_entries(memory, ["alpha"])


def test_missing_fork_says_to_run_init(tmp_path):
    from specpilot_mem.home import Home

    (tmp_path / "entries").mkdir()
    with pytest.raises(ForkError) as err:
        open_fork(Home(tmp_path))
    assert "specpilot-mem init" in err.value.fix


def test_a_writer_waits_for_the_lock_and_names_its_holder(memory, monkeypatch):
    before = snapshot(memory)
    monkeypatch.setenv("SPECPILOT_LOCK_TIMEOUT", "0.3")
    with open_fork(memory).lock():
        with pytest.raises(
            LockTimeout, match=rf"in use by pid {os.getpid()} \(specpilot-mem .*\) since .*waited 0.3 s"
        ):
            apply_entries(memory, ["alpha"], branch="deploy/x")
        with pytest.raises(LockTimeout):  # a reader waits for a writer too
            verify_memory(memory)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "specpilot_mem",
                "apply",
                "alpha",
                "--branch",
                "deploy/y",
                "--home",
                str(memory.root),
                "--json",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "SPECPILOT_LOCK_TIMEOUT": "0.3"},
        )
        assert proc.returncode == 2 and '"LockTimeout"' in proc.stdout and f"in use by pid {os.getpid()}" in proc.stdout
    assert snapshot(memory) == before


def test_read_only_commands_run_side_by_side_and_a_writer_waits_for_them(memory, monkeypatch):
    import threading

    monkeypatch.setenv("SPECPILOT_LOCK_TIMEOUT", "0.3")
    fork = open_fork(memory)
    with fork.lock(shared=True):  # another reader holds it: readers go ahead, a writer waits
        assert all(c.ok for c in verify_memory(memory))
        assert apply_entries(memory, ["alpha"]).outcomes[0].id == "alpha"
        with pytest.raises(LockTimeout, match="read-only specpilot-mem commands"):
            apply_entries(memory, ["alpha"], branch="deploy/x")
    monkeypatch.setenv("SPECPILOT_LOCK_TIMEOUT", "20")
    held = fork.lock(shared=True)
    held.__enter__()
    threading.Timer(0.3, held.__exit__, (None, None, None)).start()
    assert apply_entries(memory, ["alpha"], branch="deploy/after-wait").branch == "refs/heads/deploy/after-wait"


def test_record_refuses_bad_input(memory):
    before = snapshot(memory)
    source = source_on(memory, [], {"sglang/x.py": b"x\n"})
    with pytest.raises(RecordError, match="new entry"):
        record_entry(memory, "gamma", source, requires=[])
    with pytest.raises(RequirementError, match="ghost"):
        record_entry(memory, "gamma", source, requires=["ghost"], meta=DRAFT)
    with pytest.raises(RecordError, match="reproduces"):
        record_entry(memory, "gamma", source, requires=[], meta={**DRAFT, "reproduces": "0" * 40})
    with pytest.raises(RequirementError, match="cycle"):
        record_entry(memory, "alpha", source, requires=["beta"])
    with pytest.raises(RecordError, match="contract"):
        record_entry(memory, "gamma", source, requires=[], meta={"title": "t", "summary": "s"})
    assert snapshot(memory) == before


def test_record_refuses_a_source_not_built_on_its_requirements(memory):
    before = snapshot(memory)
    on_stock = source_on(memory, [], {"sglang/srt/specpilot/gamma.py": b"G = 1\n"})
    with pytest.raises(DeltaError, match="not built on its requirements") as err:
        record_entry(memory, "gamma", on_stock, requires=["alpha"], meta=DRAFT)
    assert "alpha" in err.value.what and SERVER_ARGS in err.value.what
    assert snapshot(memory) == before


def test_init_builds_what_reproduces_and_reports_the_rest(memory):
    from specpilot_mem.store import init_memory

    fork = open_fork(memory)
    alpha_tip = fork.repo.rev_parse("entry/alpha")
    fork.repo.git("update-ref", "-d", "refs/heads/entry/alpha")
    fork.repo.git("update-ref", "-d", "refs/heads/entry/beta")
    record = (memory.entries / "beta" / "entry.yaml").read_text()
    (memory.entries / "beta" / "entry.yaml").write_text(
        "\n".join(
            "reproduces: " + "0a" * 20 if line.startswith("reproduces:") else line for line in record.splitlines()
        )
        + "\n"
    )
    result = init_memory(memory)
    states = {b.id: b.change for b in result.branches}
    assert states == {"alpha": "created", "beta": "failed"}
    assert fork.repo.rev_parse("entry/alpha") == alpha_tip and fork.repo.rev_parse("entry/beta") is None


def test_init_refuses_a_foreign_repository_in_the_fork_path(tmp_path):
    from specpilot_mem.git import init_repo
    from specpilot_mem.home import Home
    from specpilot_mem.store import init_memory

    (tmp_path / "entries").mkdir()
    init_repo(tmp_path / "sglang-fork")
    with pytest.raises(ForkError, match="did not build") as err:
        init_memory(Home(tmp_path))
    assert "--fork-url" in err.value.fix
