"""The benchmark results index (scripts/results_index.py): provenance from git history, probes as code, the README.

The repository's own index, README and probes are checked as CI would (``--check``); the rules are checked on a
small real git repository made here.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from specpilot_mem.git import Repo, init_repo

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("results_index", ROOT / "scripts" / "results_index.py")
results_index = importlib.util.module_from_spec(_spec)  # a script, not a package
sys.modules[_spec.name] = results_index
_spec.loader.exec_module(results_index)

HARNESS = '"""A/B of two kernel variants (a probe)."""\nimport torch\nprint(torch.__version__)\n'
README = "# x\n\n## Performance\n\n| what | current figure | result |\n| --- | --- | --- |\n{rows}\n"


def test_repository_index_readme_and_probes_are_current():
    assert results_index.main(["--check"]) == 0


def commit_all(repo: Repo, message: str) -> str:
    repo.git("add", "-A")
    repo.git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)
    return repo.rev_parse("HEAD")


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    for folder in ("benchmarks/results", "benchmarks/archive/results", "benchmarks/probes", "kernels"):
        (root / folder).mkdir(parents=True)
    return root, init_repo(root)


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def row(index: dict, name: str) -> dict:
    return next(r for kind in ("current", "archived") for r in index[kind] if Path(r["file"]).name == name)


def test_derived_commits_follow_the_code_and_the_archive(project):
    root, repo = project
    write(root, "README.md", README.format(rows="| a | 1 | [a](benchmarks/results/a.json) |"))
    write(root, "kernels/op.py", "X = 1\n")
    write(root, "benchmarks/results/a.json", json.dumps({"benchmark": "demo", "date": "2026-12-01"}))
    with_code = commit_all(repo, "a kernel and the run that measured it")
    write(root, "benchmarks/results/b.json", json.dumps({"benchmark": "demo"}))
    results_only = commit_all(repo, "a result committed later, alone")
    recorded = {"commit": "ab" * 20, "dirty": True, "source": "SPECPILOT_GIT_COMMIT"}
    write(root, "benchmarks/results/c.json", json.dumps({"benchmark": "demo", "git": recorded}))
    index = results_index.build(root)
    assert row(index, "a.json")["git"]["commit"] == with_code  # committed with the code it measured
    b = row(index, "b.json")["git"]
    assert b["source"] == "derived" and b["commit"] == with_code and b["committed_in"] == results_only
    assert row(index, "c.json")["git"] == recorded  # a recorded commit is taken as recorded, even uncommitted
    assert row(index, "a.json")["date"] == "2026-12-01" and row(index, "b.json")["date"] == "unknown"

    repo.git("mv", "benchmarks/results/b.json", "benchmarks/archive/results/b.json")
    commit_all(repo, "b superseded")
    moved = row(results_index.build(root), "b.json")
    assert moved["file"] == "benchmarks/archive/results/b.json" and moved["git"]["commit"] == with_code
    write(root, "benchmarks/archive/results/b.json", json.dumps({"benchmark": "demo", "rerun": True}))
    rewritten = commit_all(repo, "b's content replaced: the new bytes were measured later")
    assert row(results_index.build(root), "b.json")["git"]["committed_in"] == rewritten


def test_embedded_harnesses_must_be_code_and_are_extracted_byte_for_byte(project):
    root, repo = project
    write(root, "README.md", README.format(rows=""))
    doc = {"benchmark": "demo", "runs": [{"harness": HARNESS, "note": "one\nline"}], "kernel_diff": "--- a\n+++ b\n"}
    write(root, "benchmarks/archive/results/probe-run.json", json.dumps(doc))
    commit_all(repo, "a probe run")
    problems = results_index.build(root)["problems"]
    assert len(problems) == 2 and all("not code under benchmarks/probes" in p for p in problems)
    written = results_index.extract_probes(root)
    assert sorted(p.relative_to(root).as_posix() for p in written) == [
        "benchmarks/probes/probe-run/kernel_diff.patch",
        "benchmarks/probes/probe-run/runs-0-harness.py",
    ]
    assert (root / "benchmarks/probes/probe-run/runs-0-harness.py").read_text() == HARNESS
    index = results_index.build(root)
    assert index["problems"] == [] and {p["file"] for p in row(index, "probe-run.json")["probes"]} == {
        "benchmarks/probes/probe-run/kernel_diff.patch",
        "benchmarks/probes/probe-run/runs-0-harness.py",
    }
    assert results_index.extract_probes(root) == []  # nothing left to write


def test_check_fails_on_a_stale_index_and_passes_once_written(project, capsys):
    root, repo = project
    write(root, "README.md", README.format(rows=""))
    write(root, "benchmarks/results/a.json", json.dumps({"benchmark": "demo", "headline": "1.5x"}))
    commit_all(repo, "a result")
    assert results_index.main(["--check", "--root", str(root)]) == 1
    assert "INDEX.md is stale" in capsys.readouterr().err
    assert results_index.main(["--root", str(root)]) == 0
    assert results_index.main(["--check", "--root", str(root)]) == 0
    assert "| 1.5x |" in (root / "benchmarks/results/INDEX.md").read_text()  # the document's own headline


def test_readme_limits(project):
    root, repo = project
    write(root, "benchmarks/results/a.json", "{}")
    index = {
        "current": [
            {"file": "benchmarks/results/a.json", "git": {"commit": "c" * 40}},
            {"file": "benchmarks/results/new.json", "git": {"commit": None}},
        ]
    }
    rows = "\n".join(
        [
            "| fine | 1 | [a](benchmarks/results/a.json) |",
            "| no link | 2 | — |",
            "| gone | 3 | [x](benchmarks/results/missing.json) |",
            "| archived | 4 | [x](benchmarks/archive/results/a.json) |",
            "| no commit | 5 | [x](benchmarks/results/new.json) |",
            f"| {'w' * 201} | 6 | [a](benchmarks/results/a.json) |",
        ]
    )
    write(root, "README.md", README.format(rows=rows) + "\n" * 150)
    problems = results_index.readme_problems(root, index)
    assert any("lines (at most 150)" in p for p in problems)
    assert any(":8: a performance row without a link" in p for p in problems)
    assert any(":9: benchmarks/results/missing.json does not exist" in p for p in problems)
    assert any(":10: a.json is not linked under benchmarks/results/" in p for p in problems)
    assert any(":11: benchmarks/results/new.json records no commit" in p for p in problems)
    assert any(":12: a table cell of 201 characters" in p for p in problems)
    assert len(problems) == 6


def test_a_link_to_a_missing_result_is_a_problem_but_a_usage_example_is_not(project):
    root, repo = project
    write(root, "benchmarks/results/a.json", "{}")
    write(
        root,
        "docs/notes.md",
        "The figure is in benchmarks/results/a.json; the old one in benchmarks/results/gone.json.\n",
    )
    write(
        root,
        "benchmarks/new_bench.py",
        '"""A new benchmark.\n\n    python3 benchmarks/new_bench.py --in x \\\\\n'
        '        --costs benchmarks/results/costs-to-come.json --out benchmarks/results/new-to-come.json\n"""\n',
    )
    commit_all(repo, "a result, a note and a benchmark whose results are still to be made")
    moved, missing = results_index.stale_links(root)
    assert moved == [] and missing == ["docs/notes.md:1: benchmarks/results/gone.json exists nowhere"]
