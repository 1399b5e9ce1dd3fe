"""`deploy new` on the real pinned stock: deployment record + branch deploy/NAME through the resolver,
--suggest with reasons, every bad input refused with nothing written; `deploy export` hands the recorded
tree to the SGLang export."""

from __future__ import annotations

import json

import pytest
from test_registry_support import evidence
from test_store_support import DRAFT, append_line, source_on

from specpilot_mem.main import main
from specpilot_mem.registry.sync import read_deployment
from specpilot_mem.store import record_entry
from specpilot_mem.store.fork import open_fork

SERVER_ARGS = "sglang/srt/server_args.py"


@pytest.fixture
def home(stock_home_copy):
    home = stock_home_copy
    record_entry(
        home,
        "alpha",
        source_on(home, [], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# alpha")}),
        requires=[],
        meta={
            **DRAFT,
            "evidence": [evidence("H200", "batch", "DFlash2")],
            "untested": [{"note": "never run with EAGLE-3", "drafter": "EAGLE-3"}],
        },
    )
    record_entry(
        home,
        "beta",
        source_on(home, ["alpha"], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# beta", ["alpha"])}),
        requires=["alpha"],
        meta={**DRAFT, "evidence": [evidence("H100", "batch", "DSpark")]},
    )
    record_entry(
        home,
        "top",
        source_on(home, [], {SERVER_ARGS: b"# top\n"}),
        requires=[],
        meta={**DRAFT, "evidence": [evidence("RTX PRO 6000", "single")]},
    )
    record_entry(home, "clash", source_on(home, [], {SERVER_ARGS: b"# clash\n"}), requires=[], meta=DRAFT)
    return home


def deploy(home, *args: str) -> tuple[int, dict]:
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["deploy", "new", "--home", str(home.root), "--json", *args])
    return code, json.loads(out.getvalue())


SETTING = (
    "--gpu",
    "H200",
    "--model",
    "Qwen3.8-27B",
    "--drafter",
    "DSpark",
    "--regime",
    "batch",
    "--batch-sizes",
    "16,8",
)


def test_new_from_entries_records_the_deployment_and_its_branch(home):
    code, data = deploy(home, "h200-dspark", *SETTING, "--from", "beta")
    assert code == 0 and data["entries"] == ["alpha", "beta"]  # beta's requirement comes along, in order
    record = read_deployment(home, "h200-dspark")
    fork = open_fork(home)
    assert (record.gpu, record.arch, record.batch_sizes, record.branch) == (
        "H200",
        "sm_90",
        [8, 16],
        "deploy/h200-dspark",
    )
    assert record.base == fork.stock_commit
    assert fork.repo.rev_parse("refs/heads/deploy/h200-dspark^{tree}") == record.tree
    text = fork.repo.git("cat-file", "blob", f"deploy/h200-dspark:{SERVER_ARGS}").stdout
    assert text.endswith(b"# alpha\n# beta\n")


def test_new_deployment_is_indexed(home, capsys):
    assert deploy(home, "indexed", *SETTING, "--from", "alpha")[0] == 0
    assert main(["sql", "--home", str(home.root), "--json", "SELECT name, entries, batch_sizes FROM deployments"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == [["indexed", ["alpha"], [8, 16]]]


def test_suggest_gives_reasons_and_flags(home, capsys):
    code, data = deploy(
        home,
        "suggested",
        "--gpu",
        "H100",
        "--model",
        "Qwen3.8-27B",
        "--drafter",
        "EAGLE-3",
        "--regime",
        "batch",
        "--batch-sizes",
        "8",
        "--suggest",
    )
    assert code == 0
    reasons = {s["id"]: s for s in data["suggestions"]}
    assert set(reasons) == {"alpha", "beta"}  # top: other arch; clash: no evidence
    assert reasons["beta"]["reasons"][:2] == ["measured on H100 SXM", "measured in the batch regime"]
    assert "never measured with the eagle drafter family (measured with DSpark)" in reasons["beta"]["flags"]
    assert reasons["alpha"]["reasons"][0] == "measured on H200 (sm_90), not on H100 SXM"
    assert "never run with EAGLE-3" in reasons["alpha"]["flags"] and reasons["alpha"]["required_by"] == ["beta"]
    record = read_deployment(home, "suggested")
    assert record.entries == ["alpha", "beta"] and "measured on H100 SXM" in record.suggested["beta"]


def test_dry_run_and_stock_only(home, capsys, monkeypatch):
    from specpilot_mem.output import console

    monkeypatch.setattr(console, "width", 200)
    assert main(["deploy", "new", "--home", str(home.root), "preview", *SETTING, "--suggest", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "suggested for H200 (sm_90)" in out and "alpha" in out and "dry run: would record" in out
    code, data = deploy(home, "preview", *SETTING, "--suggest", "--dry-run")
    assert code == 0 and data["dry_run"] and not (home.rounds / "preview").exists()
    assert open_fork(home).repo.rev_parse("refs/heads/deploy/preview") is None
    code, data = deploy(home, "plain", *SETTING)
    assert code == 0 and data["entries"] == [] and read_deployment(home, "plain").base == open_fork(home).stock_commit


@pytest.mark.parametrize(
    "args, message",
    [
        (("Bad_Name", *SETTING), "not a valid deployment name"),
        (("a..b", *SETTING), "not a valid deployment name"),
        (("x", *SETTING, "--from", "nope"), "unknown entry: nope"),
        (("x", *SETTING, "--from", "alpha,alpha"), "more than once"),
        (("x", *SETTING, "--from", "top,clash"), "top conflicts with clash"),
        (("x", "--gpu", "H300", "--model", "m", "--drafter", "d", "--regime", "single"), "unknown GPU"),
        (("x", "--gpu", "sm_90", "--model", "m", "--drafter", "d", "--regime", "single"), "sm_90 is an arch"),
        (("x", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "batch"), "needs --batch-sizes"),
        (
            ("x", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "single", "--batch-sizes", "8"),
            "serves one request",
        ),
        (
            ("x", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "batch", "--batch-sizes", "8,x"),
            "not a comma-separated",
        ),
    ],
)
def test_bad_input_writes_nothing(home, args, message):
    refs = open_fork(home).repo.refs("refs")
    code, data = deploy(home, *args)
    assert code == 2 and message in data["what"]
    assert not home.rounds.exists() or not any(home.rounds.iterdir())
    assert open_fork(home).repo.refs("refs") == refs


def test_existing_deployment_or_branch_is_refused(home):
    assert deploy(home, "twice", *SETTING, "--from", "alpha")[0] == 0
    code, data = deploy(home, "twice", *SETTING, "--from", "beta")
    assert code == 2 and "already exists" in data["what"]
    fork = open_fork(home)
    fork.repo.update_refs({"refs/heads/deploy/left-over": (None, fork.stock_commit)}, "test")
    code, data = deploy(home, "left-over", *SETTING)
    assert code == 2 and "already has a branch deploy/left-over" in data["what"]
    assert not (home.rounds / "left-over").exists()


def test_a_record_that_cannot_be_written_takes_the_branch_back(home):
    home.rounds.write_text("not a folder")
    code, data = deploy(home, "unwritable", *SETTING, "--from", "alpha")
    assert code == 2 and "cannot write the deployment record" in data["what"]
    assert open_fork(home).repo.rev_parse("refs/heads/deploy/unwritable") is None


def test_from_and_suggest_exclude_each_other(home, capsys):
    assert main(["deploy", "new", "--home", str(home.root), "x", *SETTING, "--from", "alpha", "--suggest"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_export_writes_the_recorded_tree(home, tmp_path, capsys):
    assert deploy(home, "shipped", *SETTING, "--from", "beta")[0] == 0
    capsys.readouterr()
    assert main(["deploy", "export", "--home", str(home.root), "--json", "shipped", str(tmp_path / "out")]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tree"] == read_deployment(home, "shipped").tree
    assert [e["id"] for e in data["manifest"]["entries"]] == ["alpha", "beta"]
    exported = (tmp_path / "out" / SERVER_ARGS).read_bytes()
    assert exported.endswith(b"# alpha\n# beta\n")
    assert main(["deploy", "export", "--home", str(home.root), "--json", "missing", str(tmp_path / "x")]) == 2
    assert "known deployments: shipped" in json.loads(capsys.readouterr().out)["fix"]


def test_suggest_explains_every_entry_it_did_not_pick(home, capsys):
    """The README's first example on a GPU nothing was measured on: not a silent stock-only deployment."""
    code, data = deploy(
        home,
        "nothing-fits",
        "--gpu",
        "B200",
        "--model",
        "m",
        "--drafter",
        "d",
        "--regime",
        "single",
        "--suggest",
        "--dry-run",
    )
    assert code == 0 and data["suggestions"] == []
    why = {s["id"]: s["why"] for s in data["left_out"]}
    assert set(why) == {"alpha", "beta", "top", "clash"}
    assert all(reasons and reasons[0].startswith("no evidence on B200") for reasons in why.values())
    assert (
        main(
            [
                "deploy",
                "new",
                "--home",
                str(home.root),
                "nothing-fits",
                "--gpu",
                "B200",
                "--model",
                "m",
                "--drafter",
                "d",
                "--regime",
                "single",
                "--suggest",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "left out (4)" in out and "nothing matched this deployment: each entry above says why" in out
    code, data = deploy(
        home,
        "wrong-regime",
        "--gpu",
        "H200",
        "--model",
        "m",
        "--drafter",
        "d",
        "--regime",
        "single",
        "--suggest",
        "--dry-run",
    )
    picked = {s["id"] for s in data["suggestions"]}
    assert picked | {s["id"] for s in data["left_out"]} == {"alpha", "beta", "top", "clash"}
    assert any("never measured in the single regime" in s["why"][0] for s in data["left_out"])
