"""The store's commands through ``specpilot_mem.main``: --json payloads, tables, errors, vendored kernels."""

from __future__ import annotations

import json

import pytest
from test_store_support import append_line, source_on

from specpilot_mem.main import main
from specpilot_mem.store import record_entry, vendor_kernels
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.kernels import VENDOR_DIR

SERVER_ARGS = "sglang/srt/server_args.py"


def run(capsys, home, *argv):
    code = main([*argv, "--home", str(home.root)])
    return code, capsys.readouterr().out


def run_json(capsys, home, *argv):
    code, out = run(capsys, home, *argv, "--json")
    return code, json.loads(out)


@pytest.fixture
def memory(stock_home_copy, tmp_path):
    home = stock_home_copy
    kernel = home.root / "kernels" / "specpilot_kernels" / "toy"
    kernel.mkdir(parents=True)
    (kernel / "reference.py").write_text("def toy(x):\n    return x\n")
    (kernel / "toy.py").write_text("from .reference import toy\n")
    draft = tmp_path / "draft.yaml"
    draft.write_text(
        "title: Options\nsummary: |\n  flags\ncontract:\n  level: bit-exact\n  statement: stock by default\n"
    )
    record_entry(
        home,
        "options",
        source_on(home, [], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# options")}),
        requires=[],
        meta=draft,
    )
    return home


def test_the_cuda_loader_is_vendored_with_the_shared_headers(memory, tmp_path):
    # cuda_extension.py puts the library's csrc/ on every extension's include path, so it travels with it
    library = memory.root / "kernels" / "specpilot_kernels"
    (library / "cuda_extension.py").write_text("SHARED = 'csrc'\n")
    (library / "csrc").mkdir()
    (library / "csrc" / "pdl.cuh").write_text("#pragma once\n")
    pins = vendor_kernels(memory, tmp_path / "wt", ["toy", "cuda_extension.py"])
    assert sorted(pins) == [
        f"{VENDOR_DIR}/csrc/pdl.cuh",
        f"{VENDOR_DIR}/cuda_extension.py",
        f"{VENDOR_DIR}/toy/reference.py",
        f"{VENDOR_DIR}/toy/toy.py",
    ]
    assert (tmp_path / "wt" / VENDOR_DIR / "csrc" / "pdl.cuh").read_text() == "#pragma once\n"
    assert sorted(vendor_kernels(memory, tmp_path / "wt2", ["toy"])) == [
        f"{VENDOR_DIR}/toy/reference.py",
        f"{VENDOR_DIR}/toy/toy.py",
    ]


def test_record_vendor_apply_show_graph_verify(capsys, memory, tmp_path):
    home = memory
    fork = open_fork(home)
    worktree = tmp_path / "wt"
    fork.repo.git("worktree", "add", "--quiet", "--detach", "--no-checkout", str(worktree), "entry/options")
    pins = vendor_kernels(home, worktree, ["toy"])
    assert sorted(pins) == [f"{VENDOR_DIR}/toy/reference.py", f"{VENDOR_DIR}/toy/toy.py"]
    # a no-checkout worktree holds only what we wrote: record from a commit of exactly that on the base
    files = {path: (worktree / path).read_bytes() for path in pins}
    files[f"{VENDOR_DIR}/__init__.py"] = b""
    files["sglang/srt/specpilot/__init__.py"] = b""
    (tmp_path / "toy.yaml").write_text("title: Toy\nsummary: toy kernel\ncontract: {level: bit-exact, statement: s}\n")
    code, out = run_json(
        capsys,
        home,
        "record",
        "toy",
        "--from",
        source_on(home, ["options"], files),
        "--requires",
        "options",
        "--meta",
        str(tmp_path / "toy.yaml"),
    )
    assert code == 0 and out["kernels"] == pins and out["requires"] == ["options"]

    code, out = run_json(capsys, home, "apply", "toy")
    assert code == 0 and [(e["id"], e["status"], e["reproduced"]) for e in out["entries"]] == [
        ("options", "applied", True),
        ("toy", "applied", True),
    ]
    code, out = run(capsys, home, "apply", "--all")
    assert code == 0 and "apply onto stock" in out and "toy" in out

    code, out = run_json(capsys, home, "show", "toy")
    assert out["chain"] == ["options", "toy"] and out["kernels"][0]["status"] == "current"
    code, out = run_json(capsys, home, "show", "stock")
    assert out["pinned"] and out["files"] == 5768 and len(out["excluded"]) == 10
    code, out = run(capsys, home, "show", "options")
    assert code == 0 and "required by" in out and "toy" in out

    code, out = run(capsys, home, "graph", "--format", "dot")
    assert '"toy" -> "options";' in out and '"options" -> "stock";' in out
    code, out = run_json(capsys, home, "graph", "--format", "png", "--output", str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG" and {e["id"]: e["depth"] for e in out["entries"]} == {
        "options": 0,
        "toy": 1,
    }

    # the library moves on: verify reports the vendored copy as behind, but the entry still reproduces
    (home.kernels / "toy" / "reference.py").write_text("def toy(x):\n    return 2 * x\n")
    code, out = run_json(capsys, home, "verify")
    toy = next(e for e in out["entries"] if e["id"] == "toy")
    assert code == 0 and toy["ok"] and [k["status"] for k in toy["kernels"]] == ["behind library", "current"]
    code, out = run(capsys, home, "verify")
    assert "behind: toy/reference.py" in out


def test_entry_updates_through_the_cli(capsys, memory, tmp_path):
    (tmp_path / "v.yaml").write_text("name: hopper\nhardware: [sm_90]\n")
    code, out = run_json(capsys, memory, "entry", "add-variant", "options", str(tmp_path / "v.yaml"))
    assert code == 0 and out["variants"] == [{"name": "hopper", "options": {}, "hardware": ["sm_90"], "notes": ""}]
    (tmp_path / "e.yaml").write_text(
        "kind: paired-run\ndeployment: {gpu: H200, arch: sm_90}\ncommand: x\ndate: 2026-11-30\nsynthetic: true\n"
    )
    code, out = run_json(capsys, memory, "entry", "add-evidence", "options", str(tmp_path / "e.yaml"))
    assert code == 0 and out["evidence"][0]["deployment"]["gpu"] == "H200"
    code, out = run_json(capsys, memory, "entry", "add-evidence", "options", str(tmp_path / "e.yaml"))
    assert code == 2 and out["error"] == "RecordError"
    new = source_on(memory, [], {SERVER_ARGS: append_line(memory, SERVER_ARGS, "# options v2")})
    code, out = run_json(capsys, memory, "entry", "rerecord", "options", "--from", new)
    assert code == 0 and out["source"]["commit"] == new and len(out["evidence"]) == 1


def test_conflicts_onto_another_base_are_data(capsys, memory):
    fork = open_fork(memory)
    other = fork.repo.out("commit-tree", fork.repo.rev_parse("stock^{tree}"), "-p", "stock", "-m", "moved")
    moved = source_on(memory, [], {SERVER_ARGS: b"# rewritten\n"})
    code, out = run_json(capsys, memory, "apply", "options", "--onto", moved)
    assert code == 1 and out["entries"][0]["status"] == "conflict" and out["entries"][0]["paths"] == [SERVER_ARGS]
    assert out["entries"][0]["reproduced"] is None  # reproduction is only checked onto stock
    code, out = run_json(capsys, memory, "apply", "options", "--onto", other)
    assert code == 0 and out["entries"][0]["status"] == "applied"


def test_errors_as_json_and_text(capsys, memory):
    code, out = run_json(capsys, memory, "apply", "nope")
    assert code == 2 and out["error"] == "UnknownEntryError" and "options" in out["fix"]
    code = main(["apply", "nope", "--home", str(memory.root)])
    assert code == 2 and "unknown entry 'nope'" in capsys.readouterr().err


def test_schema(capsys):
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "EntryRecord" and "reproduces" in schema["required"]
    assert main(["schema", "evidence"]) == 0 and json.loads(capsys.readouterr().out)["title"] == "Evidence"


def test_a_conflict_onto_stock_is_data_too(capsys, memory):
    """Which entries applied, which conflicted and on which paths: in --json and in the table, exit 1."""
    stock = open_fork(memory).repo.git("cat-file", "blob", f"stock:{SERVER_ARGS}").stdout
    record_entry(
        memory,
        "clash",
        source_on(memory, [], {SERVER_ARGS: stock + b"# clash\n"}),
        requires=[],
        meta={"title": "c", "summary": "s", "contract": {"level": "bit-exact", "statement": "x"}},
    )
    code, out = run_json(capsys, memory, "apply", "options", "clash")
    assert code == 1
    assert [(e["id"], e["status"], e["paths"], e["conflicts_with"]) for e in out["entries"]] == [
        ("clash", "applied", [SERVER_ARGS], []),
        ("options", "conflict", [SERVER_ARGS], ["clash"]),
    ]
    assert out["entries"][0]["reproduced"] is True and out["entries"][1]["reproduced"] is None
    code, text = run(capsys, memory, "apply", "options", "clash")
    assert code == 1 and "conflict" in text and "clash" in text and SERVER_ARGS in text
