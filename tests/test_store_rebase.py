"""Re-recording an entry that others require rebases them (requirement order, 3-way, evidence kept and
marked), or, when one conflicts, changes nothing and names each dependent with its paths."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from test_store_support import DRAFT, fork_file, prefixed_source, set_slot, synthetic_home

from specpilot_mem.errors import ConflictError
from specpilot_mem.models import Evidence
from specpilot_mem.store import load_entries, record_entry
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.record import BASE_CHANGED
from specpilot_mem.store.resolver import apply_entries
from specpilot_mem.store.verify import verify_memory

SHARED = "sglang/shared.py"
EVIDENCE = {
    "kind": "microbenchmark",
    "deployment": {"gpu": "H200", "arch": "sm_90"},
    "command": "python bench.py",
    "date": dt.date(2026, 1, 2),
    "figures": [],
}


def _slot(home, requires, slot, text, extra=None):
    files = {SHARED: set_slot(fork_file(home, requires, SHARED), "shared", slot, text), **(extra or {})}
    return prefixed_source(home, requires, files)


@pytest.fixture
def chain_home(tmp_path):
    """base <- middle <- top (and side <- base), each changing its own slot of one shared file."""
    home = synthetic_home(tmp_path)
    record_entry(home, "base", _slot(home, [], 1, "base v1"), requires=[], meta=DRAFT)
    record_entry(
        home,
        "middle",
        _slot(home, ["base"], 5, "middle", {"sglang/middle.py": b"M = 1\n"}),
        requires=["base"],
        meta={**DRAFT, "evidence": [EVIDENCE]},
    )
    record_entry(home, "top", _slot(home, ["middle"], 9, "top"), requires=["middle"], meta=DRAFT)
    record_entry(home, "side", _slot(home, ["base"], 11, "side"), requires=["base"], meta=DRAFT)
    return home


def _state(home):
    fork = open_fork(home)
    files = {p.relative_to(home.root): p.read_bytes() for p in sorted(home.entries.rglob("*")) if p.is_file()}
    return files, fork.repo.refs("refs")


def test_rerecording_a_required_entry_rebases_its_dependents(chain_home):
    home = chain_home
    before = load_entries(home)
    record_entry(home, "base", _slot(home, ["base"], 2, "base v2, a second change"))  # base's source + slot 2
    after = load_entries(home)
    fork = open_fork(home)
    for dependent in ("middle", "top", "side"):
        assert after[dependent].reproduces != before[dependent].reproduces
        result = apply_entries(home, [dependent])  # onto stock the rebased chain reproduces its new record
        assert result.tree == after[dependent].reproduces
        text = fork.repo.git("cat-file", "blob", f"{after[dependent].reproduces}:python/{SHARED}").stdout
        assert b"base v1" in text and b"base v2, a second change" in text
    text = fork.repo.git("cat-file", "blob", f"{after['top'].reproduces}:python/{SHARED}").stdout
    assert b"shared slot 5: middle" in text and b"shared slot 9: top" in text
    assert [e.revalidate for e in after["middle"].evidence] == [f"{BASE_CHANGED} (base was re-recorded)"]
    assert Evidence.model_validate({**EVIDENCE}) == after["middle"].evidence[0].model_copy(update={"revalidate": None})
    assert after["middle"].requires == ["base"] and after["top"].requires == ["middle"]
    assert all(c.ok and c.branch == "current" for c in verify_memory(home))


def test_a_conflicting_dependent_changes_nothing_and_is_named_with_its_paths(chain_home):
    home = chain_home
    state = _state(home)
    # base v2 rewrites slot 5, the line middle changes; top (requires middle) is blocked, side still rebases
    with pytest.raises(ConflictError) as err:
        record_entry(home, "base", _slot(home, ["base"], 5, "base takes slot 5"))
    assert "middle conflicts with" in err.value.what and SHARED in err.value.what
    assert "top blocked: it requires middle" in err.value.what and "side" not in err.value.what
    assert err.value.where == "entries/middle, entries/top" and "nothing was changed" in err.value.fix
    assert _state(home) == state


def test_record_src_on_the_options_entry_rebases_every_entry_on_it(project_entries_home, tmp_path, capsys):
    """The reported case: a comment added to `options` (which every SGLang entry requires) could never be
    recorded. Now `record options --src` re-records the others and `verify` passes after it."""
    import shutil

    from conftest import _shared_fork_home

    from specpilot_mem.main import main
    from specpilot_mem.store import init_memory

    root = tmp_path / "home"
    shutil.copytree(project_entries_home.entries, root / "entries", symlinks=True)
    (root / "kernels").symlink_to(project_entries_home.root / "kernels")
    home = _shared_fork_home(project_entries_home, root)
    init_memory(home, checkout=False)
    before = load_entries(home)
    dependents = sorted(i for i, r in before.items() if "options" in r.requires)
    assert dependents
    source = root / "entries" / "options" / "src" / "sglang" / "srt" / "specpilot" / "__init__.py"
    source.write_text(source.read_text() + "# a comment: required entries can change\n")
    assert main(["record", "options", "--src", "--json", "--home", str(root)]) == 0
    assert json.loads(capsys.readouterr().out)["rebased"] == dependents
    after = load_entries(home)
    for dependent in dependents:
        assert after[dependent].reproduces != before[dependent].reproduces
        assert all(e.revalidate == f"{BASE_CHANGED} (options was re-recorded)" for e in after[dependent].evidence)
        assert len(after[dependent].evidence) == len(before[dependent].evidence)
    capsys.readouterr()
    assert main(["verify", "--home", str(root)]) == 0


HEADER = "sglang/srt/specpilot/kernels/csrc/pdl.cuh"  # a vendored library file (store.kernels.VENDOR_DIR)


@pytest.fixture
def vendoring_home(tmp_path):
    """gpu-a and gpu-b each vendor the same library header (identical copies); top requires both and
    changes its own slot of a shared file."""
    home = synthetic_home(tmp_path)
    header = b"// shared header\n"
    for entry_id in ("gpu-a", "gpu-b"):
        own = {f"sglang/{entry_id.replace('-', '_')}.py": b"X = 1\n", HEADER: header}
        record_entry(home, entry_id, prefixed_source(home, [], own), requires=[], meta=DRAFT)
    record_entry(
        home,
        "top",
        _slot(home, ["gpu-a", "gpu-b"], 3, "top"),
        requires=["gpu-a", "gpu-b"],
        meta={**DRAFT, "evidence": [EVIDENCE]},
    )
    return home


def _blob(home, tree, path):
    return open_fork(home).repo.git("cat-file", "blob", f"{tree}:python/{path}").stdout


@pytest.mark.parametrize("changed", ["gpu-a", "gpu-b"])
def test_a_vendored_copy_rerecorded_by_one_entry_rebases_entries_that_carry_another(vendoring_home, changed):
    """The reported case: w12 re-vendored a shared header that gdn-tree vendors too, and tlv (which requires
    both) could not be rebased. Each entry owns its copy; in a chain the entry applied later replaces the
    copy of one before it, so the dependent rebases with no conflict and every chain reproduces."""
    home = vendoring_home
    before = load_entries(home)
    new_header = b"// shared header, a comment changed\n"
    record_entry(home, changed, prefixed_source(home, [changed], {HEADER: new_header}))
    after = load_entries(home)
    assert after[changed].kernels[HEADER] != before[changed].kernels[HEADER]
    # top's chain is gpu-a, gpu-b, top: gpu-b's copy is the one its tree holds
    want = new_header if changed == "gpu-b" else b"// shared header\n"
    assert _blob(home, after["top"].reproduces, HEADER) == want
    assert b"shared slot 3: top" in _blob(home, after["top"].reproduces, SHARED)
    result = apply_entries(home, ["top"])
    assert result.tree == after["top"].reproduces
    assert {o.id: o.files.get(HEADER) for o in result.outcomes}["gpu-b"] == "vendored copy replaced"
    assert all(c.ok and c.branch == "current" for c in verify_memory(home))
    rebased = after["top"].reproduces != before["top"].reproduces
    assert rebased == (changed == "gpu-b")  # gpu-a's new copy is replaced in top's chain: top's tree is as it was
    assert after["top"].evidence[0].revalidate == (f"{BASE_CHANGED} (gpu-b was re-recorded)" if rebased else None)


def test_two_different_copies_of_a_file_that_is_not_vendored_still_conflict(tmp_path):
    """Replacing a copy is for vendored kernel files only: two entries adding the same other file with
    different contents conflict, and the error names the first conflict of the dependent's chain."""
    home = synthetic_home(tmp_path)
    for entry_id in ("gpu-a", "gpu-b"):
        record_entry(home, entry_id, prefixed_source(home, [], {"sglang/copy.py": b"X = 1\n"}), requires=[], meta=DRAFT)
    record_entry(home, "top", _slot(home, ["gpu-a", "gpu-b"], 3, "top"), requires=["gpu-a", "gpu-b"], meta=DRAFT)
    state = _state(home)
    with pytest.raises(ConflictError) as err:
        record_entry(home, "gpu-a", prefixed_source(home, ["gpu-a"], {"sglang/copy.py": b"X = 2\n"}))
    assert "top conflicts with gpu-a (in its chain, gpu-b) in sglang/copy.py" in err.value.what
    assert _state(home) == state
