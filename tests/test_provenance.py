"""The shared result header: every field present, the device harness's commit override, atomic writes."""

import json

from specpilot_mem.provenance import result_header, write_result


def test_header_fields_and_relative_command(monkeypatch):
    monkeypatch.delenv("SPECPILOT_GIT_COMMIT", raising=False)
    doc = result_header("demo", ["benchmarks/demo.py", "--rows", "1 2"])
    assert set(doc) == {"benchmark", "date", "command", "git", "device", "versions"}
    assert doc["command"] == "python benchmarks/demo.py --rows '1 2'"
    assert doc["git"]["source"] == "git" and len(doc["git"]["commit"]) == 40
    assert doc["versions"]["torch"] and doc["device"]["kind"] in ("cpu", "cuda")


def test_commit_from_environment(monkeypatch):
    monkeypatch.setenv("SPECPILOT_GIT_COMMIT", "ab" * 20)
    monkeypatch.setenv("SPECPILOT_GIT_DIRTY", "1")
    git = result_header("demo", ["x.py"])["git"]
    assert git == {"commit": "ab" * 20, "dirty": True, "source": "SPECPILOT_GIT_COMMIT"}


def test_write_result_is_atomic_and_leaves_no_temporary(tmp_path):
    path = write_result({"a": 1}, tmp_path / "sub" / "r.json")
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]
