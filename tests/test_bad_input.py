"""Bad input, every verb: each case is refused with a clear error (what, where, how to fix) and exit code
2 — usage errors told apart from domain errors by their type — and the memory's refs, files and
``registry.duckdb`` are byte-identical before and after.

One memory home serves every case (entries alpha <- beta, a deployment ``dep``, a synced registry), and
each case runs in process through ``specpilot_mem.main`` with ``--json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_costmodel_ceiling import APPENDIX_B_PROFILE
from test_store_support import DRAFT, append_line, source_on

from specpilot_mem.main import main

SERVER_ARGS = "sglang/srt/server_args.py"
USAGE, DOMAIN = "usage", "domain"
NESTED = {"entry", "deploy", "round", "registry"}  # verbs whose sub-verb comes before the options


@pytest.fixture(scope="module")
def bad_home(stock_fork_home, tmp_path_factory):
    """(home, folder of bad files) shared by every case; cases must leave both as they were."""
    from conftest import _shared_fork_home

    from specpilot_mem.store import record_entry

    root = tmp_path_factory.mktemp("bad-input")
    (root / "home" / "entries").mkdir(parents=True)
    home = _shared_fork_home(stock_fork_home, root / "home")
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
        source_on(home, ["alpha"], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# beta", ["alpha"])}),
        requires=["alpha"],
        meta=DRAFT,
    )
    assert (
        main(
            [
                "deploy",
                "new",
                "dep",
                "--home",
                str(home.root),
                "--gpu",
                "H200",
                "--model",
                "m",
                "--drafter",
                "d",
                "--regime",
                "single",
                "--from",
                "alpha",
            ]
        )
        == 0
    )
    assert main(["apply", "alpha", "--branch", "deploy/existing", "--home", str(home.root)]) == 0
    files = root / "files"
    files.mkdir()
    write = {
        "afile": "just a file\n",
        "bad.yaml": "title: [unclosed\n",
        "list.yaml": "- a\n- b\n",
        "sets-reproduces.yaml": "title: t\nsummary: s\ncontract: {level: bit-exact, statement: x}\nreproduces: abc\n",
        "unknown-key.yaml": "title: t\nsummary: s\ncontract: {level: bit-exact, statement: x}\ncolour: red\n",
        "no-contract.yaml": "title: t\nsummary: s\n",
        "other-id.yaml": "id: someone-else\ntitle: t\nsummary: s\ncontract: {level: bit-exact, statement: x}\n",
        "bad-level.yaml": "title: t\nsummary: s\ncontract: {level: roughly, statement: x}\n",
        "evidence-missing.yaml": "kind: microbenchmark\n",
        "evidence-arch.yaml": "kind: microbenchmark\ndeployment: {gpu: H200, arch: sm_99}\ncommand: x\ndate: 2026-01-01\n",
        "evidence-date.yaml": "kind: microbenchmark\ndeployment: {gpu: H200, arch: sm_90}\ncommand: x\ndate: someday\n",
        "variant-bad.yaml": "name: 12\n",
        "requests-bad.jsonl": "{not json\n",
        "requests-empty.jsonl": "",
        "requests-fields.jsonl": '{"id": "a"}\n',
        "profile-bad.json": "{",
        "profile-format.json": '{"format": "other"}',
        "lattice.txt.npz": "not a zip\n",
        "garbage.whl": "not a wheel\n",
        "outputs-bad.jsonl": "[1, 2\n",
    }
    for name, text in write.items():
        (files / name).write_text(text)
    (files / "full").mkdir()
    (files / "full" / "x").write_text("x")
    np.savez(files / "no-arrays.npz", other=np.zeros(3))
    from specpilot_mem.replay.lattice import save_lattice
    from specpilot_mem.replay.synthetic import SyntheticSpec, generate

    save_lattice(generate(SyntheticSpec(requests=2, length=16, positions=4, candidates=4, vocab=64)), files / "ok.npz")
    data = (files / "ok.npz").read_bytes()
    (files / "truncated.npz").write_bytes(data[: len(data) // 2])
    (files / "profile-gpu.json").write_text(json.dumps({**APPENDIX_B_PROFILE, "gpu": "H300"}))
    assert main(["registry", "sync", "--home", str(home.root)]) == 0
    return home, files


def snapshot(home) -> tuple[dict, dict]:
    from specpilot_mem.git import Repo

    refs = Repo(home.fork).refs("refs")
    state = {
        str(p.relative_to(home.root)): p.read_bytes()
        for p in sorted(home.root.rglob("*"))
        if p.is_file() and p.relative_to(home.root).parts[0] not in ("sglang-fork", ".specpilot")
    }
    return refs, state


F = "{files}"


def _tf(
    *tail: str, requests="r", stock="x", system: str | tuple[str, ...] = "a=x", delta: str | None = "1"
) -> list[str]:
    """A `tf` command line that is well formed but for what a case passes."""
    argv = ["tf", "--requests", requests, "--stock", stock]
    for name in (system,) if isinstance(system, str) else system:
        argv += ["--system", name]
    if delta is not None:
        argv += ["--delta", delta]
    return [*argv, "--scorer", "m:f", *tail]


CASES: list[tuple[list[str], str, str]] = [
    # apply
    (["apply"], DOMAIN, "no entries to apply"),
    (["apply", "nope"], DOMAIN, "unknown entry 'nope'"),
    (["apply", "ALPHA"], DOMAIN, "unknown entry 'ALPHA'"),
    (["apply", "../alpha"], DOMAIN, "unknown entry '../alpha'"),
    (["apply", ""], DOMAIN, "unknown entry ''"),
    (["apply", "a b"], DOMAIN, "unknown entry 'a b'"),
    (["apply", "alpha", "nope"], DOMAIN, "unknown entry 'nope'"),
    (["apply", "alpha", "--onto", "no-such-rev"], DOMAIN, "the fork has no revision 'no-such-rev'"),
    (["apply", "alpha", "--onto", "sglang==9.9.9"], DOMAIN, "is not a pinned release"),
    (["apply", "alpha", "--onto", f"{F}/missing.whl"], DOMAIN, "missing.whl"),
    (["apply", "alpha", "--onto", f"{F}/garbage.whl"], DOMAIN, "garbage.whl"),
    (["apply", "alpha", "--branch", "refs/heads/stock"], DOMAIN, "is managed by specpilot-mem"),
    (["apply", "alpha", "--branch", "entry/alpha"], DOMAIN, "is managed by specpilot-mem"),
    (["apply", "alpha", "--branch", "bad..name"], DOMAIN, "is not a valid branch name"),
    (["apply", "alpha", "--branch", "deploy/existing", "--onto", "deploy/dep"], DOMAIN, "already exists"),
    (["apply", "alpha", "--branch", ""], DOMAIN, "--branch is empty"),
    (["apply", "alpha", "--worktree", f"{F}/afile"], DOMAIN, "exists and is not a work tree of the fork"),
    (["apply", "alpha", "--worktree", f"{F}/full"], DOMAIN, "exists and is not a work tree of the fork"),
    (["apply", "alpha", "--worktree", ""], DOMAIN, "--worktree is empty"),
    (["apply", "alpha", "--export", f"{F}/afile"], DOMAIN, "exists and is not an earlier SpecPilot export"),
    (["apply", "alpha", "--export", f"{F}/full"], DOMAIN, "exists and is not an earlier SpecPilot export"),
    (["apply", "alpha", "--export", ""], DOMAIN, "--export is empty"),
    (["apply", "alpha", "--export", f"{F}/afile/below"], DOMAIN, "afile"),
    (["apply", "alpha", "--branch", "deploy/a", "--worktree", "wt"], USAGE, "not allowed with argument"),
    (["apply", "--bogus"], USAGE, "unrecognized arguments: --bogus"),
    (["apply", "alpha", "--onto"], USAGE, "expected one argument"),
    # show
    (["show", "nope"], DOMAIN, "unknown entry 'nope'"),
    (["show", ""], DOMAIN, "unknown entry ''"),
    (["show", "[/]"], DOMAIN, "unknown entry '[/]'"),
    (["show"], USAGE, "the following arguments are required"),
    (["show", "alpha", "beta"], USAGE, "unrecognized arguments: beta"),
    # graph
    (["graph", "nope"], DOMAIN, "unknown entry 'nope'"),
    (["graph", "--format", "svg"], USAGE, "invalid choice: 'svg'"),
    (["graph", "--format", "png"], DOMAIN, "--format png needs --output FILE"),
    (["graph", "--format", "png", "--output", f"{F}/missing/g.png"], DOMAIN, "there is no folder"),
    (["graph", "--format", "png", "--output", f"{F}/full"], DOMAIN, "it is a folder"),
    (["graph", "--output", "g.png"], DOMAIN, "--output is only for --format png"),
    # record
    (["record", "Bad_ID", "--from", "stock"], DOMAIN, "is not a valid entry id"),
    (["record", "-lead", "--from", "stock"], USAGE, "the following arguments are required"),
    (["record", "x", "--from", "no-such-rev"], DOMAIN, "the fork has no revision 'no-such-rev'"),
    (["record", "x"], USAGE, "one of the arguments --from --src is required"),
    (["record", "x", "--from", "stock", "--src"], USAGE, "not allowed with argument"),
    (["record", "fresh", "--from", "stock"], DOMAIN, "is a new entry and has no title"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/missing.yaml"], DOMAIN, "no draft record at"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/bad.yaml"], DOMAIN, "malformed YAML"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/list.yaml"], DOMAIN, "must be a YAML mapping"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/sets-reproduces.yaml"], DOMAIN, "which record fills in"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/unknown-key.yaml"], DOMAIN, "colour"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/no-contract.yaml"], DOMAIN, "contract"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/other-id.yaml"], DOMAIN, "the draft's id"),
    (["record", "fresh", "--from", "stock", "--meta", f"{F}/bad-level.yaml"], DOMAIN, "contract.level"),
    (["record", "fresh", "--from", "stock", "--requires", "nope"], DOMAIN, "requires 'nope'"),
    (["record", "alpha", "--from", "stock", "--requires", "beta"], DOMAIN, "requirement cycle"),
    (["record", "alpha", "--from", "stock", "--requires", "alpha"], DOMAIN, "requirement cycle"),
    (["record", "alpha", "--src", "--requires", "beta"], DOMAIN, "--src keeps the record's requirements"),
    (["record", "alpha", "--src", "--meta", f"{F}/bad.yaml"], DOMAIN, "--src keeps the record's requirements"),
    (["record", "alpha", "--src"], DOMAIN, "src"),
    (["record", "alpha", "beta", "--from", "stock"], DOMAIN, "--from records one entry"),
    (["sources", "nope"], DOMAIN, "unknown entry 'nope'"),
    (["sources", "alpha"], DOMAIN, "alpha keeps no sources"),
    (["record", "x", "--from", f"{F}/full"], DOMAIN, "is not a work tree of the fork"),
    (["record", "beta", "--from", "stock"], DOMAIN, "not built on its requirements"),
    # entry
    (["entry", "set-status", "nope", "candidate"], DOMAIN, "unknown entry 'nope'"),
    (["entry", "set-status", "alpha", "bogus"], USAGE, "invalid choice: 'bogus'"),
    (["entry", "set-status", "alpha", "verified", "--release", "abc"], DOMAIN, "abc"),
    (["entry", "add-evidence", "alpha", f"{F}/missing.yaml"], DOMAIN, "no record at"),
    (["entry", "add-evidence", "alpha", f"{F}/evidence-missing.yaml"], DOMAIN, "invalid Evidence"),
    (["entry", "add-evidence", "alpha", f"{F}/evidence-arch.yaml"], DOMAIN, "H200 is sm_90, not sm_99"),
    (["entry", "add-evidence", "alpha", f"{F}/evidence-date.yaml"], DOMAIN, "date"),
    (["entry", "add-evidence", "alpha", f"{F}/bad.yaml"], DOMAIN, "malformed YAML"),
    (["entry", "add-evidence", "alpha", f"{F}/list.yaml"], DOMAIN, "mapping"),
    (["entry", "add-evidence", "nope", f"{F}/evidence-arch.yaml"], DOMAIN, "H200 is sm_90, not sm_99"),
    (["entry", "add-variant", "alpha", f"{F}/variant-bad.yaml"], DOMAIN, "invalid Variant"),
    (["entry", "add-variant", "alpha", f"{F}/missing.yaml"], DOMAIN, "no record at"),
    (["entry", "rerecord", "nope", "--from", "stock"], DOMAIN, "nope"),
    (["entry", "rerecord", "alpha", "--from", "no-such-rev"], DOMAIN, "the fork has no revision"),
    (["entry", "rerecord", "alpha"], USAGE, "the following arguments are required: --from"),
    (["entry", "bogus"], USAGE, "invalid choice: 'bogus'"),
    # query
    (["query", "--gpu", "H300"], DOMAIN, "unknown GPU 'H300'"),
    (["query", "--gpu", "sm_75"], DOMAIN, "unknown arch 'sm_75'"),
    (["query", "--arch", "H100"], DOMAIN, "--arch takes an arch id"),
    (["query", "--arch", "sm_999"], DOMAIN, "unknown arch"),
    (["query", "--gpu", "H100", "--arch", "sm_120"], DOMAIN, "contradicts --arch sm_120"),
    (["query", "--gpu", ""], DOMAIN, "--gpu is empty"),
    (["query", "--gpu", "  "], DOMAIN, "--gpu is empty"),
    (["query", "--arch", ""], DOMAIN, "--arch is empty"),
    (["query", "--model", ""], DOMAIN, "--model is empty"),
    (["query", "--drafter", ""], DOMAIN, "--drafter is empty"),
    (["query", "--text", " "], DOMAIN, "--text is empty"),
    (["query", "--requires", ""], DOMAIN, "--requires is empty"),
    (["query", "--release", ""], DOMAIN, "--release is empty"),
    (["query", "--regime", "sideways"], USAGE, "invalid choice: 'sideways'"),
    (["query", "--status", "bogus"], USAGE, "invalid choice: 'bogus'"),
    (["query", "--status", "unchecked"], DOMAIN, "--status unchecked needs --release"),
    (["query", "--release", "abc"], DOMAIN, "is not an SGLang version"),
    (["query", "--requires", "nope"], DOMAIN, "unknown entry: nope"),
    (["query", "--validated-only", "yes"], USAGE, "unrecognized arguments: yes"),
    # sql
    (["sql", "SELEC 1"], DOMAIN, "the SQL does not parse"),
    (["sql", "SELECT * FROM nope"], DOMAIN, "the query failed"),
    (["sql", "DROP TABLE entries"], DOMAIN, "entries"),
    (["sql", "DELETE FROM entries"], DOMAIN, "entries"),
    (["sql", "INSERT INTO meta VALUES ('a', 'b')"], DOMAIN, "only SELECT statements run here"),
    (["sql", "COPY entries TO 'out.csv'"], DOMAIN, "COPY"),
    (["sql", "ATTACH 'other.duckdb' AS other"], DOMAIN, "ATTACH"),
    (["sql", "SELECT * FROM read_csv('x.csv')"], DOMAIN, "the query failed"),
    (["sql", ""], DOMAIN, "SQL"),
    (["sql"], USAGE, "the following arguments are required"),
    # deploy new / export
    (
        ["deploy", "new", "d2", "--gpu", "H300", "--model", "m", "--drafter", "d", "--regime", "single"],
        DOMAIN,
        "unknown GPU 'H300'",
    ),
    (
        ["deploy", "new", "d2", "--gpu", "sm_90", "--model", "m", "--drafter", "d", "--regime", "single"],
        DOMAIN,
        "is an arch",
    ),
    (
        ["deploy", "new", "d2", "--gpu", "", "--model", "m", "--drafter", "d", "--regime", "single"],
        DOMAIN,
        "unknown GPU ''",
    ),
    (
        ["deploy", "new", "d2", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "batch"],
        DOMAIN,
        "needs --batch-sizes",
    ),
    (
        [
            "deploy",
            "new",
            "d2",
            "--gpu",
            "H200",
            "--model",
            "m",
            "--drafter",
            "d",
            "--regime",
            "batch",
            "--batch-sizes",
            "0",
        ],
        DOMAIN,
        "batch",
    ),
    (
        [
            "deploy",
            "new",
            "d2",
            "--gpu",
            "H200",
            "--model",
            "m",
            "--drafter",
            "d",
            "--regime",
            "batch",
            "--batch-sizes",
            "a,b",
        ],
        DOMAIN,
        "batch",
    ),
    (
        ["deploy", "new", "Bad Name", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "single"],
        DOMAIN,
        "Bad Name",
    ),
    (
        ["deploy", "new", "../up", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "single"],
        DOMAIN,
        "../up",
    ),
    (["deploy", "new", "dep", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "single"], DOMAIN, "dep"),
    (
        [
            "deploy",
            "new",
            "d2",
            "--gpu",
            "H200",
            "--model",
            "m",
            "--drafter",
            "d",
            "--regime",
            "single",
            "--from",
            "nope",
        ],
        DOMAIN,
        "unknown entry: nope",
    ),
    (
        [
            "deploy",
            "new",
            "d2",
            "--gpu",
            "H200",
            "--model",
            "m",
            "--drafter",
            "d",
            "--regime",
            "single",
            "--from",
            "alpha",
            "--suggest",
        ],
        USAGE,
        "not allowed with argument",
    ),
    (
        ["deploy", "new", "d2", "--gpu", "H200", "--drafter", "d", "--regime", "single"],
        USAGE,
        "the following arguments are required: --model",
    ),
    (
        ["deploy", "new", "d2", "--gpu", "H200", "--model", "m", "--drafter", "d", "--regime", "twice"],
        USAGE,
        "invalid choice: 'twice'",
    ),
    (["deploy", "export", "nope", "out"], DOMAIN, "nope"),
    (["deploy", "export", "dep", f"{F}/afile"], DOMAIN, "afile"),
    (["deploy", "export", "dep", f"{F}/full"], DOMAIN, "full"),
    (["deploy", "export", "dep"], USAGE, "the following arguments are required"),
    (["deploy", "bogus"], USAGE, "invalid choice: 'bogus'"),
    # round
    (["round", "status", "nope"], DOMAIN, "there is no deployment 'nope'"),
    (["round", "report", "nope"], DOMAIN, "there is no deployment 'nope'"),
    (["round", "resume", "nope"], DOMAIN, "there is no deployment 'nope'"),
    (["round", "status", "dep"], DOMAIN, "deployment 'dep' has no rounds"),
    (["round", "status", "dep", "--round", "abc"], USAGE, "invalid int value: 'abc'"),
    (["round", "start", "nope", "--requests", f"{F}/requests-bad.jsonl"], DOMAIN, "nope"),
    (["round", "start", "dep", "--requests", f"{F}/missing.jsonl"], DOMAIN, "missing.jsonl"),
    (["round", "start", "dep", "--requests", f"{F}/requests-bad.jsonl"], DOMAIN, "requests-bad.jsonl"),
    (["round", "start", "dep", "--requests", f"{F}/requests-empty.jsonl"], DOMAIN, "requests-empty.jsonl"),
    (["round", "start", "dep", "--requests", f"{F}/requests-fields.jsonl"], DOMAIN, "requests-fields.jsonl"),
    (
        ["round", "start", "dep", "--requests", "r.jsonl", "--pool", "ray", "--devices", "x"],
        DOMAIN,
        "--devices is the number of GPUs",
    ),
    (
        ["round", "start", "dep", "--requests", "r.jsonl", "--address", "10.0.0.1:6379"],
        DOMAIN,
        "--address names a Ray cluster",
    ),
    (["round", "start", "dep", "--requests", "r.jsonl", "--pool", "bogus"], USAGE, "invalid choice: 'bogus'"),
    (["round", "start", "dep"], USAGE, "the following arguments are required: --requests"),
    (["round", "start", "dep", "--requests", "r.jsonl", "--repeats", "x"], USAGE, "invalid int value: 'x'"),
    (["round", "bogus", "dep"], USAGE, "invalid choice: 'bogus'"),
    # replay / ceiling
    (["replay", f"{F}/missing.npz"], DOMAIN, "cannot read lattice file"),
    (["replay", f"{F}/truncated.npz"], DOMAIN, "damaged or truncated"),
    (["replay", f"{F}/lattice.txt.npz"], DOMAIN, "damaged or truncated"),
    (["replay", f"{F}/no-arrays.npz"], DOMAIN, "lattice file lacks arrays"),
    (["replay", f"{F}/afile"], DOMAIN, "cannot read lattice file"),
    (["replay", f"{F}/ok.npz", "--builders", "bogus"], DOMAIN, "bogus"),
    (["replay", f"{F}/ok.npz", "--nodes", "x"], DOMAIN, "--nodes"),
    (["replay", f"{F}/ok.npz", "--nodes", "8,-3"], DOMAIN, "--nodes"),
    (["replay", f"{F}/ok.npz", "--plot", f"{F}/afile/p.png"], DOMAIN, "afile"),
    (["replay"], USAGE, "the following arguments are required"),
    (["ceiling", f"{F}/missing.json", "--lattices", f"{F}/ok.npz"], DOMAIN, "cannot read profile"),
    (["ceiling", f"{F}/profile-bad.json", "--lattices", f"{F}/ok.npz"], DOMAIN, "cannot read profile"),
    (["ceiling", f"{F}/profile-format.json", "--lattices", f"{F}/ok.npz"], DOMAIN, "not a profile"),
    (["ceiling", f"{F}/profile-gpu.json", "--lattices", f"{F}/ok.npz"], DOMAIN, "unknown GPU 'H300'"),
    (["ceiling", f"{F}/profile-gpu.json", "--lattices", f"{F}/truncated.npz"], DOMAIN, "unknown GPU 'H300'"),
    (
        ["ceiling", f"{F}/profile-gpu.json", "--setting", "bogus", "--lattices", f"{F}/ok.npz"],
        USAGE,
        "invalid choice: 'bogus'",
    ),
    (["ceiling", f"{F}/profile-gpu.json"], USAGE, "the following arguments are required: --lattices"),
    # tf
    (
        _tf(requests=f"{F}/afile", stock=f"{F}/afile", system="s=x", delta="-1"),
        DOMAIN,
        "--delta must be a positive number",
    ),
    (
        _tf(requests=f"{F}/afile", stock=f"{F}/afile", system="s=x", delta="nan"),
        DOMAIN,
        "--delta must be a positive number",
    ),
    (
        _tf(requests=f"{F}/afile", stock=f"{F}/afile", system="s=x", delta="0"),
        DOMAIN,
        "--delta must be a positive number",
    ),
    (_tf(requests=f"{F}/missing.jsonl", system="s=x"), DOMAIN, "missing.jsonl"),
    (_tf(requests=f"{F}/requests-bad.jsonl", system="s=x"), DOMAIN, "requests-bad.jsonl"),
    (_tf(system="noequals"), DOMAIN, "noequals"),
    (_tf(system=("a=x", "a=y")), DOMAIN, "twice"),
    (_tf("--audit-sample", "0"), DOMAIN, "--audit-sample must be positive"),
    (_tf("--split", "bogus"), USAGE, "invalid choice: 'bogus'"),
    (_tf(delta=None), USAGE, "one of the arguments --ar --delta is required"),
    (_tf(delta="abc"), USAGE, "invalid float value: 'abc'"),
    # schema, init, port, revalidate, serve, browse, verify, the top level
    (["schema", "bogus"], USAGE, "invalid choice: 'bogus'"),
    (["init", "--wheel", f"{F}/garbage.whl"], DOMAIN, "is not a zip archive"),
    (["init", "--wheel", f"{F}/missing.whl"], DOMAIN, "no wheel at"),
    (["init", "--wheel", f"{F}/garbage.whl", "--fork-url", f"{F}/full"], DOMAIN, "exclude each other"),
    (["init", "--fork-url", f"{F}/full"], DOMAIN, "--fork-url needs --stock-rev"),
    (["init", "--fork-url", f"{F}/full", "--stock-rev", "main"], DOMAIN, "already holds another stock"),
    (["port", "nope", "--onto", "sglang==0.5.20"], DOMAIN, "unknown entry 'nope'"),
    (["port", "alpha", "--onto", "sglang==9.9.9"], DOMAIN, "is not a pinned release"),
    (["port", "alpha", "--onto", f"{F}/missing.whl"], DOMAIN, "missing.whl"),
    (["port", "alpha"], USAGE, "the following arguments are required: --onto"),
    (["revalidate", "--release", "abc"], DOMAIN, "abc"),
    (["revalidate", "--release", "sglang==9.9.9"], DOMAIN, "is not a pinned release"),
    (["revalidate"], USAGE, "the following arguments are required: --release"),
    (["serve", "nope"], DOMAIN, "no deployment 'nope'"),
    (["serve", "--gpu", "x", "dep"], USAGE, "invalid int value: 'x'"),
    (["serve", "--python", f"{F}/missing-python", "dep"], DOMAIN, "missing-python"),
    (["browse", "--out", f"{F}/afile"], DOMAIN, "afile"),
    (["browse", "--port", "x"], USAGE, "invalid int value: 'x'"),
    (["verify", "--bogus"], USAGE, "unrecognized arguments: --bogus"),
    (["bogus-verb"], USAGE, "invalid choice: 'bogus-verb'"),
    (["registry", "bogus"], USAGE, "invalid choice: 'bogus'"),
]


def _argv(argv: list[str], files: Path) -> list[str]:
    argv = [a.replace(F, str(files)) for a in argv]
    depth = 2 if argv[0] in NESTED and len(argv) > 1 else 1
    return [*argv[:depth], "--json", *argv[depth:]]


@pytest.fixture(scope="module")
def before(bad_home):
    return snapshot(bad_home[0])


def restore(home, before) -> None:
    """Put back what a failing case changed, so one defect does not fail every later case."""
    from specpilot_mem.git import Repo

    refs, files = before
    now_refs, now_files = snapshot(home)
    repo = Repo(home.fork)
    repo.update_refs(
        {ref: (now_refs.get(ref), refs.get(ref)) for ref in {*refs, *now_refs} if refs.get(ref) != now_refs.get(ref)},
        "test: restore",
    )
    for path in now_files.keys() - files.keys():
        (home.root / path).unlink()
    for path, data in files.items():
        if now_files.get(path) != data:
            (home.root / path).parent.mkdir(parents=True, exist_ok=True)
            (home.root / path).write_bytes(data)


@pytest.mark.parametrize("argv,kind,what", CASES, ids=[" ".join(c[0])[:70] for c in CASES])
def test_bad_input_is_refused_clearly_and_changes_nothing(
    bad_home, before, argv, kind, what, capsys, monkeypatch, tmp_path
):
    home, files = bad_home
    monkeypatch.setenv("SPECPILOT_HOME", str(home.root))
    monkeypatch.chdir(tmp_path)  # relative paths in the cases name nothing
    try:
        code = main(_argv(argv, files))
        out = capsys.readouterr().out
        try:
            error = json.loads(out)
        except json.JSONDecodeError:
            error = {"error": None, "what": out[-300:], "where": None, "fix": None}
        problems = []
        if code != 2:
            problems.append(f"exit {code}")
        if (error.get("error") == "UsageError") != (kind == USAGE):
            problems.append(f"type {error.get('error')} for a {kind} error")
        if not any(what in (error.get(k) or "") for k in ("what", "where", "fix")):
            problems.append(f"{what!r} not said")
        problems += [f"no {k}" for k in ("what", "where", "fix") if not error.get(k)]
        if snapshot(home) != before:
            problems.append("the memory changed")
        if list(tmp_path.iterdir()):
            problems.append(f"wrote {[p.name for p in tmp_path.iterdir()]}")
        assert not problems, f"{problems}: {error}"
    finally:
        restore(home, before)


def test_the_suite_is_large_enough():
    assert len(CASES) >= 150 and len({tuple(c[0]) for c in CASES}) == len(CASES)
