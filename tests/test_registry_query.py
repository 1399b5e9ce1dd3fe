"""`query` semantics on a hand-made memory, and the `query` and `sql` commands."""

from __future__ import annotations

import json

import pytest
from test_registry_support import entry, evidence, write_home

from specpilot_mem.errors import SpecPilotError, UnknownEntryError
from specpilot_mem.main import main
from specpilot_mem.registry.query import QueryFilters, query_entries
from specpilot_mem.registry.sync import connect


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    records = [
        entry(
            "w12",
            title="W12 weights",
            evidence_items=[
                evidence("H200", "single", "DFlash2", "Qwen3.8-27B"),
                evidence("RTX PRO 6000", "single", "DFlash2", "Muse-Glimmer-30B"),
            ],
            variants={"sm90-wgmma": ["sm_90"], "sm120-mma": ["sm_120"]},
            limits=["the LM head stays BF16 on H100"],
            untested=[{"note": "never timed with batching", "regime": "batch"}],
        ),
        entry(
            "certified-head",
            requires=["w12"],
            evidence_items=[evidence("H100", "single", "DSpark")],
            untested=[{"note": "slower than BF16 on the RTX PRO 6000", "gpu": "RTX PRO 6000"}],
        ),
        entry(
            "tree-verify",
            requires=["certified-head"],
            evidence_items=[evidence("H100 SXM", "batch", "EAGLE-3", "Gemma-4-12B")],
            variants={"sm90": ["sm_90"], "sm120": ["sm_120"]},
            untested=[{"note": "DSpark batching never timed", "regime": "batch", "drafter": "DSpark"}],
        ),
        entry("batch-share", evidence_items=[evidence("H200", "batch", "DSpark", synthetic=True)]),
        entry("rejected", evidence_items=[evidence("H200", verdict="reject")]),
        entry(
            "blackwell-only",
            evidence_items=[evidence("RTX PRO 6000", kind="microbenchmark")],
            variants={"sm120": ["sm_120"]},
        ),
    ]
    return write_home(tmp_path_factory.mktemp("hand-made"), records)


def run_query(home, **filters) -> dict[str, object]:
    con = connect(home)
    try:
        return {m.id: m for m in query_entries(con, QueryFilters(**filters))}
    finally:
        con.close()


def classes(matches) -> dict[str, str | None]:
    return {entry_id: m.hardware for entry_id, m in matches.items()}


def test_gpu_match_tells_this_gpu_from_same_arch(home):
    found = run_query(home, gpu="H200")
    assert classes(found) == {
        "w12": "gpu",
        "batch-share": "gpu",
        "rejected": "gpu",
        "certified-head": "arch",
        "tree-verify": "arch",
    }
    assert found["certified-head"].hardware_note == "measured on H100 SXM (sm_90), not on H200"
    assert found["w12"].best.gpu == "H200"  # the evidence shown is the one on the asked GPU
    on_h100 = run_query(home, gpu="h100")
    assert on_h100["certified-head"].hardware == "gpu" and on_h100["w12"].hardware == "arch"


def test_arch_id_and_arch_option(home):
    by_arch = classes(run_query(home, gpu="sm_90"))
    assert set(by_arch.values()) == {"arch"} and len(by_arch) == 5
    assert classes(run_query(home, arch="sm_90")) == by_arch


def test_variant_never_run_on_the_arch(home):
    found = run_query(home, gpu="rtx-pro-6000")
    assert classes(found) == {"w12": "gpu", "blackwell-only": "gpu", "tree-verify": "variant"}
    assert found["tree-verify"].hardware_note == "variant sm120 built for sm_120, never run on it"


def test_setting_filters_apply_to_one_evidence_row(home):
    assert classes(run_query(home, gpu="H200", regime="batch")) == {"batch-share": "gpu", "tree-verify": "arch"}
    assert set(run_query(home, drafter="eagle")) == {"tree-verify"}  # EAGLE-3, case and punctuation ignored
    assert set(run_query(home, drafter="dspark", regime="batch")) == {"batch-share"}
    assert set(run_query(home, model="qwen3.8")) == {
        "w12",
        "certified-head",
        "batch-share",
        "rejected",
        "blackwell-only",
    }
    # a variant for the arch counts only when the entry was measured in the asked setting somewhere
    assert run_query(home, gpu="sm_120", drafter="DSpark") == {}


def test_untested_items_the_query_names_are_flagged(home):
    found = run_query(home, gpu="H200", regime="batch")
    assert [u["note"] for u in found["tree-verify"].flagged] == ["DSpark batching never timed"]
    assert found["batch-share"].flagged == []
    w12 = run_query(home, gpu="H200")["w12"]
    assert w12.untested[0]["note"] == "never timed with batching" and w12.flagged == []
    assert [u["note"] for u in run_query(home, requires="w12")["certified-head"].untested] == [
        "slower than BF16 on the RTX PRO 6000"
    ]


def test_requires_text_and_validated(home):
    assert set(run_query(home, requires="w12")) == {
        "certified-head",
        "tree-verify",
    }  # tree-verify through certified-head
    assert set(run_query(home, text="LM head bf16")) == {"w12"}  # every word, in the limits here
    assert set(run_query(home, text="W12 nowhere")) == set()
    # many words, repeated or not, are one condition (the statement does not grow with the input)
    assert set(run_query(home, text=" ".join(["bf16"] * 5000 + ["lm", "head"] * 2000))) == {"w12"}
    assert set(run_query(home, text=" ".join(f"w{n}" for n in range(3000)))) == set()
    assert set(run_query(home, validated_only=True)) == {"w12", "certified-head", "tree-verify"}


def test_bad_filters_are_clear_errors(home):
    with pytest.raises(SpecPilotError, match="unknown GPU 'H300'") as err:
        run_query(home, gpu="H300")
    assert "RTX PRO 6000" in err.value.fix and "sm_120" in err.value.fix
    with pytest.raises(SpecPilotError, match="unknown arch"):
        run_query(home, gpu="sm_75")
    with pytest.raises(SpecPilotError, match="--arch takes an arch id"):
        run_query(home, arch="H100")
    with pytest.raises(SpecPilotError, match="contradicts --arch sm_120"):
        run_query(home, gpu="H200", arch="sm_120")
    with pytest.raises(UnknownEntryError, match="nope"):
        run_query(home, requires="nope")


def test_query_command_json_and_table(home, capsys, monkeypatch):
    from specpilot_mem.output import console

    monkeypatch.setattr(console, "width", 200)  # room for whole ids in the table
    assert main(["query", "--home", str(home.root), "--gpu", "H200", "--regime", "batch", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == "H200" and data["arch"] == "sm_90" and data["count"] == 2
    assert [(e["id"], e["hardware"]) for e in data["entries"]] == [("batch-share", "gpu"), ("tree-verify", "arch")]
    assert data["entries"][1]["flagged"][0]["drafter"] == "DSpark"
    assert main(["query", "--home", str(home.root), "--gpu", "H200"]) == 0
    out = capsys.readouterr().out
    assert "this GPU" in out and "same arch" in out and "certified-head" in out
    assert main(["query", "--home", str(home.root), "--gpu", "B100", "--json"]) == 2
    assert "B200" in json.loads(capsys.readouterr().out)["fix"]


def test_sql_reads_and_refuses_writes(home, capsys):
    assert (
        main(
            [
                "sql",
                "--home",
                str(home.root),
                "--json",
                "WITH t AS (SELECT entry_id, count(*) AS n FROM evidence GROUP BY entry_id) SELECT * FROM t ORDER BY entry_id",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["columns"] == ["entry_id", "n"] and ["w12", 2] in data["rows"]
    before = home.registry.read_bytes()
    for statement, message in [
        ("DELETE FROM entries", "only SELECT statements run here; this is DELETE"),
        ("SELECT 1; DROP TABLE entries", "expected one statement, got 2"),
        ("ATTACH 'other.duckdb'", "this is ATTACH"),
        ("COPY entries TO 'out.csv'", "this is COPY"),
        ("SELECT * FROM read_csv('/etc/hostname')", "the query failed"),
        ("SELEC 1", "does not parse"),
    ]:
        assert main(["sql", "--home", str(home.root), "--json", statement]) == 2
        assert message in json.loads(capsys.readouterr().out)["what"]
    assert home.registry.read_bytes() == before
