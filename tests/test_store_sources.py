"""Entry sources hold each file once: whole where the entry owns it, its own patch where a requirement changes
the file too. Re-recording a requirement re-renders its dependents' patches (no hand rebase); a dependent that
conflicts changes nothing and names the file and the fix, which is followed here; ``sources`` migrates the
older whole-copy layout, all or nothing, idempotently."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pytest
from test_store_support import DRAFT, fork_file, prefixed_source, set_slot, slotted, synthetic_home

from specpilot_mem.errors import ConflictError, RecordError
from specpilot_mem.main import main
from specpilot_mem.store import load_entries, record_entry
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.record import BASE_CHANGED, record_sources
from specpilot_mem.store.resolver import Resolver, apply_entries
from specpilot_mem.store.sources import read_sources, render_sources, source_problems, write_entry_sources
from specpilot_mem.store.verify import verify_memory

SHARED = "sglang/shared.py"
EVIDENCE = {
    "kind": "microbenchmark",
    "deployment": {"gpu": "H200", "arch": "sm_90"},
    "command": "python bench.py",
    "date": dt.date(2026, 1, 2),
}


def _put(home, entry_id, files):
    """Write ``files`` ({path under entries/<id>/: bytes}) into the entry's folder."""
    for rel, content in files.items():
        target = home.entry_dir(entry_id) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def _state(home):
    files = {p.relative_to(home.root): p.read_bytes() for p in sorted(home.entries.rglob("*")) if p.is_file()}
    return files, open_fork(home).repo.refs("refs")


def _blob(home, tree, path):
    return open_fork(home).repo.git("cat-file", "blob", f"{tree}:python/{path}").stdout


@pytest.fixture
def sources_home(tmp_path):
    """base <- middle <- top, recorded from sources; each changes its own slot of one shared file, and
    middle wrote it as a whole copy (the older layout)."""
    home = synthetic_home(tmp_path)
    _put(home, "base", {f"src/{SHARED}": set_slot(slotted("shared"), "shared", 1, "base v1")})
    record_sources(home, ["base"], requires=[], meta=DRAFT)
    whole = set_slot(fork_file(home, ["base"], SHARED), "shared", 5, "middle")
    _put(home, "middle", {f"src/{SHARED}": whole, "src/sglang/middle.py": b"M = 1\n"})
    record_sources(home, ["middle"], requires=["base"], meta={**DRAFT, "evidence": [EVIDENCE]})
    _put(home, "top", {f"src/{SHARED}": set_slot(fork_file(home, ["middle"], SHARED), "shared", 9, "top")})
    record_sources(home, ["top"], requires=["middle"], meta=DRAFT)
    return home


def test_a_dependent_keeps_only_its_own_change_to_a_file_its_requirement_changes(sources_home):
    home = sources_home
    assert sorted(read_sources(home, "base")) == [f"src/{SHARED}"]
    # middle's whole copy became its patch: the file lives whole in base only
    assert sorted(read_sources(home, "middle")) == [f"patches/{SHARED}.patch", "src/sglang/middle.py"]
    assert sorted(read_sources(home, "top")) == [f"patches/{SHARED}.patch"]
    patch = read_sources(home, "middle")[f"patches/{SHARED}.patch"]
    assert b"+shared slot 5: middle" in patch and b"base v1" not in patch
    resolver = Resolver(open_fork(home))
    for entry_id in ("base", "middle", "top"):
        assert source_problems(resolver, entry_id, read_sources(home, entry_id)) == []
        assert render_sources(resolver, entry_id) == read_sources(home, entry_id)
    assert b"shared slot 9: top" in _blob(home, load_entries(home)["top"].reproduces, SHARED)


@pytest.mark.parametrize("how", ["sources", "fork commit"])
def test_rerecording_a_requirement_rebases_its_dependents_sources_without_hand_work(sources_home, how):
    home = sources_home
    before = load_entries(home)
    whole = home.entry_dir("base") / "src" / SHARED
    edited = set_slot(whole.read_bytes(), "shared", 2, "base v2")
    if how == "sources":
        whole.write_bytes(edited)
        record_sources(home, ["base"])
    else:  # record --from a commit: base's own sources are written from it too
        record_entry(home, "base", prefixed_source(home, [], {SHARED: edited}))
        assert whole.read_bytes() == edited
    after = load_entries(home)
    resolver = Resolver(open_fork(home))
    for dependent in ("middle", "top"):
        assert after[dependent].reproduces != before[dependent].reproduces
        assert source_problems(resolver, dependent, read_sources(home, dependent)) == []
        assert render_sources(resolver, dependent) == read_sources(home, dependent)
    assert [e.revalidate for e in after["middle"].evidence] == [f"{BASE_CHANGED} (base was re-recorded)"]
    text = _blob(home, after["top"].reproduces, SHARED)
    assert b"base v2" in text and b"shared slot 5: middle" in text and b"shared slot 9: top" in text
    # rebuilding a dependent from its (re-rendered) sources gives its rebased tree: nothing to do by hand
    assert [r.reproduces for r in record_sources(home, ["middle", "top"])] == [
        after["middle"].reproduces,
        after["top"].reproduces,
    ]
    assert all(c.ok and c.sources == "current" for c in verify_memory(home))


def test_a_conflicting_dependent_changes_nothing_and_its_fix_works(sources_home):
    home = sources_home
    state = _state(home)
    whole = home.entry_dir("base") / "src" / SHARED
    mine = set_slot(whole.read_bytes(), "shared", 5, "base takes slot 5")
    whole.write_bytes(mine)
    with pytest.raises(ConflictError) as err:
        record_sources(home, ["base"])
    assert f"middle conflicts with base in {SHARED}" in err.value.what
    assert "top blocked: it requires middle" in err.value.what
    assert "nothing was changed" in err.value.fix
    assert f"entries/middle/src/{SHARED}" in err.value.fix and "record base middle --src" in err.value.fix
    whole.write_bytes(state[0][whole.relative_to(home.root)])
    assert _state(home) == state
    # the fix: middle's full version of the file over the new base (its change moved to slot 6), recorded together
    whole.write_bytes(mine)
    _put(home, "middle", {f"src/{SHARED}": set_slot(mine, "shared", 6, "middle")})
    recorded = record_sources(home, ["base", "middle"])
    assert [r.id for r in recorded] == ["base", "middle"]
    text = _blob(home, load_entries(home)["top"].reproduces, SHARED)
    assert b"base takes slot 5" in text and b"slot 6: middle" in text and b"slot 9: top" in text
    assert f"src/{SHARED}" not in read_sources(home, "middle")  # back to its patch
    # middle was rebuilt over the new base in the same change: its evidence is marked as a rebased one's is
    assert [e.revalidate for e in load_entries(home)["middle"].evidence] == [f"{BASE_CHANGED} (base was re-recorded)"]
    assert all(c.ok and c.sources == "current" for c in verify_memory(home))


def test_a_patch_that_no_longer_applies_names_the_file_and_the_fix(sources_home):
    home = sources_home
    state = _state(home)
    patch = home.entry_dir("middle") / "patches" / f"{SHARED}.patch"
    patch.write_bytes(patch.read_bytes().replace(b"-shared slot 5\n", b"-shared slot 5 as it never was\n"))
    edited = _state(home)
    with pytest.raises(ConflictError) as err:
        record_sources(home, ["middle"])
    assert (
        f"middle's patch of {SHARED} does not apply to the file as its requirements leave it (changed by base)"
        in err.value.what
    )
    assert err.value.where.endswith(f"entries/middle/patches/{SHARED}.patch")
    assert f"entries/middle/src/{SHARED}" in err.value.fix
    assert _state(home) == edited != state


def _project_copy(project_entries_home, tmp_path):
    from conftest import _shared_fork_home

    from specpilot_mem.store import init_memory

    root = tmp_path / "home"
    shutil.copytree(project_entries_home.entries, root / "entries", symlinks=True)
    (root / "kernels").symlink_to(project_entries_home.root / "kernels")
    home = _shared_fork_home(project_entries_home, root)
    init_memory(home, checkout=False)
    return home


def _whole_copies_of_required_files(home):
    """(entry, path) for each whole source file that one of the entry's requirements changes too."""
    resolver = Resolver(open_fork(home))
    found = []
    for entry_id, record in resolver.records.items():
        touched = resolver.walk(resolver.fork.stock_tree, resolver.chain(record.requires)).overlay
        found += [
            (entry_id, rel[4:]) for rel in read_sources(home, entry_id) if rel.startswith("src/") and rel[4:] in touched
        ]
    return found


def _whole_copy_layout(home):
    """Put every entry's patches back as whole copies of its version of the file (the layout before sources held
    each file once); returns {entry: [the paths]}."""
    repo = open_fork(home).repo
    changed = {}
    for entry_id, record in load_entries(home).items():
        for patch in sorted((home.entry_dir(entry_id) / "patches").rglob("*.patch")):
            path = patch.relative_to(home.entry_dir(entry_id) / "patches").as_posix()[: -len(".patch")]
            _put(home, entry_id, {f"src/{path}": repo.git("cat-file", "blob", f"{record.reproduces}:{path}").stdout})
            patch.unlink()
            changed.setdefault(entry_id, []).append(path)
        if (home.entry_dir(entry_id) / "patches").is_dir():
            shutil.rmtree(home.entry_dir(entry_id) / "patches")
    return changed


def test_migration_of_the_project_entries_is_exact_atomic_and_idempotent(project_entries_home, tmp_path, capsys):
    home = _project_copy(project_entries_home, tmp_path)
    root = str(home.root)
    records = load_entries(home)
    deltas = {i: (home.entry_dir(i) / "delta.patch").read_bytes() for i in records}

    # a source edited and not recorded: the migration names it and writes nothing
    edited = home.entry_dir("options") / "src" / "sglang" / "srt" / "specpilot" / "__init__.py"
    original = edited.read_bytes()
    edited.write_bytes(original + b"# not recorded\n")
    state = _state(home)
    with pytest.raises(RecordError) as err:
        write_entry_sources(home)
    assert "options: sglang/srt/specpilot/__init__.py differs" in err.value.what
    assert "nothing was changed" in err.value.fix
    assert _state(home) == state
    edited.write_bytes(original)

    # the older layout: every patch put back as the whole copy of the entry's version of the file
    older = _whole_copy_layout(home)
    assert older  # dflash-tree, shared-budget, drafter-block and tlv patch files their requirements change
    assert main(["sources", "--check", "--json", "--home", root]) == 1
    assert set(json.loads(capsys.readouterr().out)["changed"]) == set(older)
    assert main(["sources", "--json", "--home", root]) == 0
    first = json.loads(capsys.readouterr().out)
    assert {e["id"]: e["converted"] for e in first["entries"] if e["converted"]} == older
    assert _whole_copies_of_required_files(home) == []
    assert main(["sources", "--check", "--json", "--home", root]) == 0  # idempotent
    assert json.loads(capsys.readouterr().out)["changed"] == []
    # records and deltas are untouched: every entry reproduces byte for byte, and so do its sources
    assert load_entries(home) == records
    assert {i: (home.entry_dir(i) / "delta.patch").read_bytes() for i in records} == deltas
    checks = verify_memory(home)
    assert all(c.ok and c.sources == "current" for c in checks), [(c.id, c.problem, c.sources) for c in checks]
    # rebuilding the converted entries from their new sources (one change) gives their recorded trees
    rebuilt = record_sources(home, sorted(older))
    assert {r.id: r.reproduces for r in rebuilt} == {i: records[i].reproduces for i in older}
    result = apply_entries(home, sorted(records))
    assert not result.conflicts and all(o.reproduced for o in result.outcomes)


def test_rerecording_dflash_tree_rebases_its_dependents_sources(project_entries_home, tmp_path, capsys):
    """The reported case: a change to dflash-tree's sources left stale copies of its files in shared-budget,
    drafter-block and tlv; now their sources follow it, and rebuilding them keeps dflash-tree's change."""
    home = _project_copy(project_entries_home, tmp_path)
    root = str(home.root)
    write_entry_sources(home)
    source = home.entry_dir("dflash-tree") / "src" / "sglang" / "srt" / "specpilot" / "dflash_tree.py"
    line = b"# a comment from a re-record of dflash-tree\n"
    source.write_bytes(line + source.read_bytes())
    assert main(["record", "dflash-tree", "--src", "--json", "--home", root]) == 0
    out = json.loads(capsys.readouterr().out)
    dependents = sorted(
        i
        for i, r in load_entries(home).items()
        if "dflash-tree" in Resolver(open_fork(home)).closure([i]) and i != "dflash-tree"
    )
    assert out["rebased"] == dependents and set(dependents) <= set(out["sources"])
    after = load_entries(home)
    rebuilt = record_sources(home, [d for d in dependents])
    for record in rebuilt:
        assert record.reproduces == after[record.id].reproduces
        if record.id != "tlv":  # tlv does not change dflash_tree.py; shared-budget and drafter-block patch it
            assert line in _blob_plain(home, record.reproduces, "sglang/srt/specpilot/dflash_tree.py")
    assert all(c.ok and c.sources == "current" for c in verify_memory(home))


def _blob_plain(home, tree, path):
    return open_fork(home).repo.git("cat-file", "blob", f"{tree}:{path}").stdout
