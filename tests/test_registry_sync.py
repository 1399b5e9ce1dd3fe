"""Sync: incremental by content hash, rebuilt when unreadable or of another schema, atomic for readers, one
writer at a time, bad records change nothing; deployments, rounds and promotions are indexed."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import threading

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_registry_support import entry, evidence, table_contents, write_home

from specpilot_mem.errors import RecordError, RegistryError
from specpilot_mem.main import main
from specpilot_mem.models import DeploymentRecord
from specpilot_mem.registry.schema import SCHEMA_VERSION
from specpilot_mem.registry.sync import connect, sync, writer_lock
from specpilot_mem.rounds.models import PromotionLog, PromotionRecord, RoundConfig, RoundState
from specpilot_mem.store.records import dump_record, save_entry, write_atomic

SHA = "ab" * 20


@pytest.fixture
def home(tmp_path):
    return write_home(
        tmp_path,
        [
            entry("alpha", evidence_items=[evidence("H200")]),
            entry("beta", requires=["alpha"], evidence_items=[evidence("H100", "batch", "DSpark")]),
        ],
    )


def ids(home) -> list[str]:
    con = connect(home)
    try:
        return [r[0] for r in con.execute("SELECT id FROM entries ORDER BY id").fetchall()]
    finally:
        con.close()


def test_first_sync_builds_then_only_changes_are_reindexed(home):
    home.state.mkdir()
    crashed = home.state / "registry-build-999999-1.duckdb"  # left by a writer that died mid-build
    crashed.write_bytes(b"half a database")
    first = sync(home)
    assert not crashed.exists()
    assert first.rebuilt and first.reason == "no registry yet" and first.records == 2
    assert sync(home).wrote is False

    save_entry(home, entry("alpha", title="renamed", evidence_items=[evidence("H200")]))
    save_entry(home, entry("gamma"))
    changed = sync(home)
    assert (changed.rebuilt, changed.added, changed.changed, changed.removed) == (
        False,
        ["entries/gamma/entry.yaml"],
        ["entries/alpha/entry.yaml"],
        [],
    )
    (home.entry_dir("beta") / "entry.yaml").unlink()
    assert sync(home).removed == ["entries/beta/entry.yaml"]

    con = connect(home)
    try:
        assert con.execute("SELECT id, title FROM entries ORDER BY id").fetchall() == [
            ("alpha", "renamed"),
            ("gamma", "mechanism gamma"),
        ]
        assert con.execute("SELECT count(*) FROM evidence WHERE entry_id = 'beta'").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM requirements").fetchone() == (0,)
    finally:
        con.close()


def test_readers_sync_first_when_a_record_changed(home):
    assert ids(home) == ["alpha", "beta"]
    save_entry(home, entry("delta"))
    assert ids(home) == ["alpha", "beta", "delta"]


def test_corrupt_or_old_schema_registry_is_rebuilt(home):
    sync(home)
    home.registry.write_bytes(b"not a duckdb file" * 100)
    assert sync(home).reason == "registry unreadable or of another schema version"
    assert ids(home) == ["alpha", "beta"]

    con = duckdb.connect(str(home.registry))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION - 1)])
    con.execute("DELETE FROM entries")
    con.close()
    report = sync(home)
    assert report.rebuilt and ids(home) == ["alpha", "beta"]


def test_bad_record_changes_nothing(home):
    sync(home)
    before = (home.registry.read_bytes(), home.registry.stat().st_ino)
    path = home.entry_dir("beta") / "entry.yaml"
    path.write_text(path.read_text().replace("arch: sm_90", "arch: hopper"))
    with pytest.raises(RecordError) as err:
        sync(home)
    assert f"{path}:" in err.value.where and "arch" in err.value.where  # file, line and field from the store's loader
    path.write_text("id: [unclosed\n")
    with pytest.raises(RecordError, match="malformed YAML"):
        sync(home)
    assert (home.registry.read_bytes(), home.registry.stat().st_ino) == before
    assert not list(home.state.glob("registry-build-*"))


def test_known_gpu_on_the_wrong_arch_is_refused(home):
    save_entry(home, entry("wrong-arch", evidence_items=[evidence("H200")]))
    path = home.entry_dir("wrong-arch") / "entry.yaml"
    path.write_text(path.read_text().replace("arch: sm_90", "arch: sm_120"))  # edited by hand
    with pytest.raises(RecordError, match="H200 is sm_90, not sm_120") as err:
        sync(home)
    assert str(path) in err.value.where


def test_readers_keep_a_consistent_snapshot_while_a_sync_replaces_the_file(home):
    reader = connect(home)
    try:
        save_entry(home, entry("epsilon"))
        sync(home)
        # the open reader still sees the whole old index; new readers see the whole new one
        assert reader.execute("SELECT count(*) FROM entries").fetchone() == (2,)
        assert ids(home) == ["alpha", "beta", "epsilon"]
    finally:
        reader.close()


def test_one_writer_at_a_time(home):
    sync(home)
    for n in range(6):
        save_entry(home, entry(f"parallel-{n}"))
    reports = []
    with writer_lock(home):  # hold the lock: both syncs must wait for it, then agree on one result
        threads = [threading.Thread(target=lambda: reports.append(sync(home))) for _ in range(2)]
        for t in threads:
            t.start()
        threads[0].join(timeout=0.3)
        assert not reports, "a sync wrote while another process held the writer lock"
    for t in threads:
        t.join()
    assert sorted(len(r.added) for r in reports) == [0, 6]
    assert len(ids(home)) == 8


def test_deployments_rounds_and_promotions_are_indexed(home, capsys):
    sync(home)
    deployment = DeploymentRecord(
        name="h200-qwen",
        gpu="H200",
        arch="sm_90",
        model="Qwen3.8-27B",
        drafter="DFlash2",
        regime="single",
        batch_sizes=[1],
        entries=["alpha"],
        suggested={"alpha": "measured on H200"},
        base=SHA,
        branch="deploy/h200-qwen",
        tree=SHA,
        created=dt.date(2026, 11, 30),
    )
    write_atomic(home.rounds / "h200-qwen" / "deployment.yaml", dump_record(deployment))
    round_dir = home.rounds / "h200-qwen" / "round-1"
    state = RoundState(
        deployment="h200-qwen",
        number=1,
        config=RoundConfig(system_repo="sglang-fork", requests="requests/dev.jsonl", devices=["cuda:0", "cuda:1"]),
        start=SHA,
        lineage="round/h200-qwen/1",
        best=SHA,
        stock=SHA,
        done=["cost-model", "explore"],
        started=dt.datetime(2026, 11, 30, 9, 0, tzinfo=dt.timezone.utc),
        distilled=["alpha"],
    )
    write_atomic(round_dir / "round.yaml", dump_record(state))
    promotion = PromotionRecord(
        order=1,
        direction="w12",
        phase="explore",
        candidate=SHA,
        merge=SHA,
        previous_best=SHA,
        gain=1.076,
        ci_low=1.05,
        ci_high=1.10,
        noise=0.001,
        threshold=1.012,
        token_forcing="accept",
        requests=64,
        devices=["cuda:0", "cuda:1"],
    )
    write_atomic(round_dir / "promotions.yaml", dump_record(PromotionLog(promotions=[promotion])))
    (home.rounds / "h200-qwen" / "round-2").mkdir()  # no round.yaml yet: not a round

    report = sync(home)
    assert report.added == ["rounds/h200-qwen/deployment.yaml", "rounds/h200-qwen/round-1/"]
    assert (
        main(
            [
                "sql",
                "--home",
                str(home.root),
                "--json",
                "SELECT d.name, r.round, p.direction, p.gain, r.distilled FROM deployments d "
                "JOIN rounds r ON r.deployment = d.name JOIN promotions p USING (deployment, round)",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["rows"] == [["h200-qwen", 1, "w12", 1.076, ["alpha"]]]

    promotion.gain = 1.08
    write_atomic(round_dir / "promotions.yaml", dump_record(PromotionLog(promotions=[promotion])))
    assert sync(home).changed == ["rounds/h200-qwen/round-1/"]
    con = connect(home)
    try:
        assert con.execute("SELECT gain FROM promotions").fetchall() == [(1.08,)]
    finally:
        con.close()


def test_registry_command(home, capsys):
    assert main(["registry", "sync", "--home", str(home.root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rebuilt"] and data["records"] == 2 and data["wrote"]
    assert main(["registry", "sync", "--home", str(home.root)]) == 0
    assert "registry up to date" in capsys.readouterr().out
    assert main(["registry", "rebuild", "--home", str(home.root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "rebuild requested"
    # options given before the nested verb count too
    assert main(["registry", "--json", "--home", str(home.root), "sync"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "up to date"


def test_unwritable_registry_or_state_is_a_clear_error(home):
    home.registry.mkdir()  # something that is not a file where the registry goes: the rename must fail
    with pytest.raises(RegistryError, match="cannot write the registry"):
        sync(home)
    assert home.registry.is_dir() and not list(home.state.glob("registry-build-*"))
    home.registry.rmdir()
    shutil.rmtree(home.state)
    home.state.write_text("not a folder")  # machine-local state (lock, hash cache) cannot be kept
    with pytest.raises(RegistryError, match="cannot take the registry's writer lock"):
        sync(home)
    assert not home.registry.exists()


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "edit", "remove"]), st.integers(0, 4)), min_size=1, max_size=5))
def test_incremental_sync_always_equals_a_rebuild(tmp_path_factory, steps):
    home = write_home(tmp_path_factory.mktemp("steps"), [entry("e0", evidence_items=[evidence("H200")])])
    sync(home)
    for n, (action, k) in enumerate(steps):
        path = home.entry_dir(f"e{k}")
        if action == "remove":
            shutil.rmtree(path, ignore_errors=True)
        else:
            gpu = ("H100", "H200", "RTX PRO 6000", "B200")[(k + n) % 4]
            requires = ["e0"] if k and (home.entry_dir("e0") / "entry.yaml").exists() else []
            save_entry(
                home,
                entry(
                    f"e{k}",
                    title=f"{action} {n}",
                    requires=requires,
                    evidence_items=[evidence(gpu, ("single", "batch")[n % 2])],
                ),
            )
        assert not sync(home).rebuilt
        incremental = table_contents(home.registry)
        assert sync(home, rebuild=True).rebuilt
        assert table_contents(home.registry) == incremental


def test_rebuilding_an_unchanged_memory_leaves_the_file_byte_identical(home):
    sync(home, rebuild=True)
    before = home.registry.read_bytes()
    assert sync(home, rebuild=True).wrote
    assert home.registry.read_bytes() == before  # DuckDB's random database id would differ in a new file
    save_entry(home, entry("gamma"))
    sync(home)
    assert home.registry.read_bytes() != before


@pytest.mark.parametrize(
    "damage",
    [
        "ALTER TABLE entries DROP COLUMN title",
        "ALTER TABLE entries ADD COLUMN extra INTEGER",
        "DROP TABLE evidence",
    ],
)
def test_a_registry_of_the_right_version_and_wrong_shape_is_rebuilt(home, damage):
    sync(home)
    con = duckdb.connect(str(home.registry))
    con.execute(damage)
    con.close()
    con = connect(home)  # the file is rebuilt, not trusted: every table and column is back
    try:
        assert con.execute("SELECT count(title) FROM entries").fetchone()[0] == 2
        assert con.execute("SELECT count(*) FROM evidence").fetchone()[0] == 2
        assert "extra" not in [r[0] for r in con.execute("DESCRIBE entries").fetchall()]
    finally:
        con.close()
    report = sync(home)
    assert not report.wrote and report.reason == "up to date"


def test_evidence_marked_for_revalidation_no_longer_validates(tmp_path):
    stale = {**evidence("H200"), "revalidate": "base changed: re-validate (options was re-recorded)"}
    home = write_home(
        tmp_path, [entry("fresh", evidence_items=[evidence("H200")]), entry("stale", evidence_items=[stale])]
    )
    con = connect(home)
    try:
        assert dict(con.execute("SELECT id, validated FROM entries").fetchall()) == {"fresh": True, "stale": False}
    finally:
        con.close()


def test_equal_registries_built_anywhere_are_equal_files(tmp_path):
    """DuckDB writes a random id into each new file; the registry replaces it by one derived from the content,
    so a rebuild in another checkout gives the committed bytes."""
    records = [entry("alpha", evidence_items=[evidence("H200")]), entry("beta", requires=["alpha"])]
    first, second = write_home(tmp_path / "one", records), write_home(tmp_path / "two", records)
    sync(first, rebuild=True)
    sync(second, rebuild=True)
    assert first.registry.read_bytes() == second.registry.read_bytes()
    con = connect(first)  # and DuckDB still opens it
    try:
        assert con.execute("SELECT count(*) FROM entries").fetchone()[0] == 2
    finally:
        con.close()
