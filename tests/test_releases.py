"""Other SGLang releases as bases: the import's checks and determinism, the port check's verdicts, ports,
revalidate, entry status in the registry, query and --suggest — on a small release wheel made from stock's
own files (so nothing is downloaded); the real releases are in test_releases_real.py."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from contextlib import redirect_stdout

import pytest
from test_registry_support import evidence
from test_store_support import DRAFT, source_on, stock_text

from specpilot_mem.main import main
from specpilot_mem.models import EntryRecord
from specpilot_mem.store import load_entry, record_entry
from specpilot_mem.store import releases as releases_module
from specpilot_mem.store.fork import open_fork

ARGS = "sglang/srt/server_args.py"
UTILS = "sglang/srt/utils/common.py"
HTTP = "sglang/srt/entrypoints/http_server.py"
ENGINE = "sglang/srt/entrypoints/engine.py"
VERSION = "0.9.0.dev1"  # not a pinned release: a wheel path is imported as it is
VERIFIED = {"status": "verified", "scope": {"sglang": "0.5.23", "arch": ["sm_90"]}}


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_release_wheel(path, files: dict[str, bytes], name: str = "sglang", version: str = VERSION):
    """A wheel with ``files`` (a few of SGLang's, edited as upstream would), METADATA and RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {**files, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()}
    rows = []
    with zipfile.ZipFile(path, "w") as wheel:
        for member, content in files.items():
            info = zipfile.ZipInfo(member)
            info.external_attr = 0o100644 << 16
            wheel.writestr(info, content)
            rows.append(f"{member},{_digest(content)},{len(content)}")
        wheel.writestr(f"{dist}/RECORD", "\n".join(rows + [f"{dist}/RECORD,,"]) + "\n")
    return path


def edit_line(text: bytes, old: bytes, new: bytes) -> bytes:
    assert old in text
    return text.replace(old, new, 1)


@pytest.fixture
def memory(stock_home_copy, tmp_path):
    """Entries recorded on stock, and a release wheel whose files relate to each in a known way."""
    home = stock_home_copy
    args, utils, http, engine = (stock_text(home, p) for p in (ARGS, UTILS, HTTP, ENGINE))
    first_utils = utils.splitlines(keepends=True)[0]
    first_http = http.splitlines(keepends=True)[0]
    # drift: "tail" appends to server_args.py; upstream edits its first line (away from the entry's hunk)
    record_entry(
        home,
        "tail",
        source_on(home, [], {ARGS: args + b"# tail\n"}),
        requires=[],
        meta={**DRAFT, **VERIFIED, "evidence": [evidence("H200", "batch", "DFlash2")]},
    )
    # clean: "stays" adds a file of its own
    record_entry(
        home,
        "stays",
        source_on(home, ["tail"], {"sglang/srt/specpilot_stays.py": b"X = 1\n"}),
        requires=["tail"],
        meta={**DRAFT, **VERIFIED},
    )
    # superseded: upstream made the same change to utils
    record_entry(
        home,
        "upstreamed",
        source_on(home, [], {UTILS: edit_line(utils, first_utils, b"# upstreamed\n")}),
        requires=[],
        meta=DRAFT,
    )
    # conflict: upstream changed the same line of http_server.py differently; "after" requires it: blocked
    record_entry(
        home,
        "clash",
        source_on(home, [], {HTTP: edit_line(http, first_http, b"# ours\n")}),
        requires=[],
        meta={**DRAFT, **VERIFIED},
    )
    record_entry(
        home,
        "after",
        source_on(home, ["clash"], {"sglang/srt/specpilot_after.py": b""}),
        requires=["clash"],
        meta=DRAFT,
    )
    wheel = make_release_wheel(
        tmp_path / f"sglang-{VERSION}-py3-none-any.whl",
        {
            "sglang/__init__.py": b"",
            ARGS: b"# upstream header\n" + args.split(b"\n", 1)[1],
            UTILS: edit_line(utils, first_utils, b"# upstreamed\n"),
            HTTP: edit_line(http, first_http, b"# theirs\n"),
            ENGINE: engine,
        },
    )
    return home, wheel


def cli(home, *args: str) -> tuple[int, dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main([args[0], "--home", str(home.root), "--json", *args[1:]])
    return code, json.loads(out.getvalue())


def snapshot(home) -> tuple[dict, dict]:
    files = {
        p.relative_to(home.root).as_posix(): p.read_bytes() for p in sorted(home.entries.rglob("*")) if p.is_file()
    }
    return open_fork(home).repo.refs("refs"), files


def test_apply_onto_a_wheel_reports_every_verdict(memory):
    home, wheel = memory
    code, data = cli(home, "apply", "--all", "--onto", str(wheel))
    assert code == 1  # conflicts are reported, and the exit status says there were some
    verdicts = {e["id"]: e for e in data["entries"]}
    assert {k: v["verdict"] for k, v in verdicts.items()} == {
        "tail": "drift",
        "stays": "clean",
        "upstreamed": "superseded",
        "clash": "conflict",
        "after": "blocked",
    }
    tail = verdicts["tail"]["files"][0]
    assert (tail["path"], tail["how"], tail["upstream"]) == (ARGS, "hunks", "changed")
    assert not tail["hunks"][0]["touched"] and "away from the entry's lines" in tail["reason"]
    clash = verdicts["clash"]["files"][0]
    assert (
        verdicts["clash"]["conflicts"] == [HTTP]
        and clash["hunks"][0]["touched"]
        and clash["hunks"][0]["old_start"] == 1
    )
    assert verdicts["after"]["blocked_by"] == ["clash"]
    release = data["release"]
    assert release["ref"] == f"refs/heads/release/{VERSION}" and not release["pinned"]
    assert open_fork(home).repo.rev_parse(release["ref"]) == release["commit"]


def test_the_import_is_deterministic(memory, stock_fork_home, tmp_path):
    import shutil

    from conftest import _shared_fork_home

    home, wheel = memory
    other = tmp_path / "other"
    shutil.copytree(home.entries, other / "entries")
    first = cli(home, "apply", "tail", "--onto", str(wheel))[1]["release"]
    second = cli(_shared_fork_home(stock_fork_home, other), "apply", "tail", "--onto", str(wheel))
    assert second[1]["release"]["commit"] == first["commit"] and second[1]["release"]["tree"] == first["tree"]
    message = open_fork(home).repo.git("cat-file", "commit", first["commit"]).stdout.decode()
    assert f"release: SGLang {VERSION} from a wheel ({wheel.name}, sha256 " in message
    assert "author SpecPilot" in message or "1767139200 +0000" in message


def test_port_writes_a_variant_that_applies_exactly(memory):
    home, wheel = memory
    code, data = cli(home, "port", "tail", "--onto", str(wheel))
    assert code == 0 and data["entries"][0]["verdict"] == "drift"
    record = load_entry(home, "tail")
    check = record.release_check(VERSION)
    assert (check.status, check.verdict, check.port.source) == ("candidate", "drift", "0.5.23")
    patch = home.entry_dir("tail") / check.port.delta
    assert patch.is_file() and hashlib.sha256(patch.read_bytes()).hexdigest() == check.port.sha256
    # with the port the entry applies as recorded and reproduces the port's tree; its dependent is clean on it
    code, data = cli(home, "apply", "tail", "stays", "--onto", str(wheel), "--branch", "deploy/ported")
    verdicts = {e["id"]: e for e in data["entries"]}
    assert code == 0 and verdicts["tail"]["verdict"] == "clean" and verdicts["tail"]["ported"]
    assert verdicts["tail"]["tree"] == check.port.reproduces and data["branch"] == "refs/heads/deploy/ported"
    assert cli(home, "port", "tail", "--onto", str(wheel))[1]["entries"][0]["already_ported"]


@pytest.mark.parametrize(
    "ids, message",
    [
        (["clash"], "clash conflicts in sglang/srt/entrypoints/http_server.py"),
        (["after"], "after is blocked by clash"),
        (["upstreamed"], "already upstream (superseded)"),
        (["tail", "nope"], "unknown entry 'nope'"),
    ],
)
def test_port_refuses_and_writes_nothing(memory, ids, message):
    home, wheel = memory
    cli(home, "apply", "tail", "--onto", str(wheel))  # the release is imported: only the port is under test
    before = snapshot(home)
    code, data = cli(home, "port", *ids, "--onto", str(wheel))
    assert code == 2 and message in data["what"]
    assert snapshot(home) == before


def test_revalidate_demotes_what_it_cannot_confirm(memory):
    home, wheel = memory
    code, data = cli(home, "revalidate", "--release", str(wheel))
    assert code == 0
    result = {e["id"]: e for e in data["entries"]}
    assert {k: (v["verdict"], v["before"], v["after"]) for k, v in result.items()} == {
        "tail": ("drift", None, "candidate"),
        "stays": ("clean", None, "candidate"),
        "upstreamed": ("superseded", None, "superseded"),
        "clash": ("conflict", None, "candidate"),
        "after": ("blocked", None, "candidate"),
    }
    assert "once tail is confirmed" in result["stays"]["action"]
    assert [(m["entry"], m["gpu"], m["regime"]) for m in data["remeasure"] if m["entry"] == "tail"] == [
        ("tail", "H200", "batch")
    ]
    assert load_entry(home, "tail").status == "verified"  # its own release's status is untouched
    assert load_entry(home, "clash").release_check(VERSION).conflicts == [HTTP]
    # after re-measuring, tail is confirmed there; a second pass keeps it and confirms stays on top of it
    assert cli(home, "entry", "set-status", "tail", "verified", "--release", VERSION)[0] == 0
    code, data = cli(home, "revalidate", "--release", str(wheel))
    result = {e["id"]: e for e in data["entries"]}
    assert result["tail"]["after"] == "verified" and result["stays"]["after"] == "verified"
    assert result["tail"]["before"] == "verified" and not result["tail"]["demoted"]
    code, data = cli(home, "entry", "set-status", "clash", "verified", "--release", VERSION)
    assert code == 2 and "does not apply" in data["what"]


def test_a_re_record_runs_the_release_checks_again(memory):
    """Re-recording used to drop an entry's release checks (they were of the old delta), so every re-record
    needed a `revalidate` per release. Now the checks the entry and its dependents hold run again: the same
    records as a `revalidate` afterwards would write, and a port of the old delta is dropped."""
    home, wheel = memory
    assert cli(home, "revalidate", "--release", str(wheel))[0] == 0
    assert cli(home, "port", "tail", "--onto", str(wheel))[0] == 0
    assert load_entry(home, "tail").release_check(VERSION).port is not None
    before = {i: load_entry(home, i).release_check(VERSION) for i in ("clash", "after", "stays")}
    assert (before["clash"].verdict, before["after"].verdict) == ("conflict", "blocked")
    # clash now edits http_server.py's last line, away from upstream's change of its first: it merges
    http = stock_text(home, HTTP)
    last = http.splitlines(keepends=True)[-1]
    record_entry(home, "clash", source_on(home, [], {HTTP: http[: -len(last)] + b"# ours, at the end\n"}))
    clash, after = load_entry(home, "clash").release_check(VERSION), load_entry(home, "after").release_check(VERSION)
    assert (clash.verdict, clash.conflicts, clash.changed) == ("drift", [], [HTTP])
    assert (after.verdict, after.blocked_by) == ("clean", [])
    # stays' own new file changes its delta, not its verdict: the check stands as it was
    record_entry(home, "stays", source_on(home, ["tail"], {"sglang/srt/specpilot_stays.py": b"X = 2\n"}))
    assert load_entry(home, "stays").release_check(VERSION) == before["stays"]
    # a new delta of tail: its port was of the old one, so it goes, and the check runs on the recorded delta
    args = stock_text(home, ARGS)
    record_entry(home, "tail", source_on(home, [], {ARGS: args + b"# tail, second version\n"}))
    tail = load_entry(home, "tail").release_check(VERSION)
    assert tail.port is None and tail.verdict == "drift"
    records = snapshot(home)[1]
    assert cli(home, "revalidate", "--release", str(wheel))[0] == 0
    assert snapshot(home)[1] == records


def test_a_re_record_names_the_release_checks_it_could_not_run(memory):
    """A check on a release the fork no longer holds (an unpinned wheel's import, its branch deleted) cannot run
    again: it is dropped, and `record` names the release and the command that checks it."""
    home, wheel = memory
    assert cli(home, "revalidate", "--release", str(wheel))[0] == 0
    fork = open_fork(home)
    fork.repo.git("update-ref", "-d", f"refs/heads/release/{VERSION}")
    source = source_on(home, ["tail"], {"sglang/srt/specpilot_stays.py": b"X = 3\n"})
    code, data = cli(home, "record", "stays", "--from", source)
    assert code == 0 and data["dropped_releases"] == [VERSION]
    assert load_entry(home, "stays").release_check(VERSION) is None
    assert load_entry(home, "tail").release_check(VERSION) is not None  # not re-recorded: its check stands


def test_revalidate_on_stock_checks_reproduction(memory):
    home, _ = memory
    code, data = cli(home, "revalidate", "--release", "0.5.23")
    assert code == 0 and {e["verdict"] for e in data["entries"]} == {"clean"}
    assert {e["id"]: e["after"] for e in data["entries"]}["tail"] == "verified"
    assert all(not r.releases for r in (load_entry(home, i) for i in ("tail", "clash")))


def test_query_and_registry_show_status(memory):
    home, wheel = memory
    cli(home, "revalidate", "--release", str(wheel))
    code, data = cli(home, "query", "--status", "verified")
    assert code == 0 and sorted(e["id"] for e in data["entries"]) == ["clash", "stays", "tail"]
    code, data = cli(home, "query", "--release", VERSION, "--status", "superseded")
    assert [e["id"] for e in data["entries"]] == ["upstreamed"]
    code, data = cli(home, "query", "--release", "0.5.21", "--status", "unchecked")
    assert len(data["entries"]) == 5
    code, data = cli(home, "query", "--release", "latest")
    assert code == 2 and "not an SGLang version" in data["what"]
    code, data = cli(
        home, "sql", f"SELECT entry_id, verdict FROM releases WHERE release = '{VERSION}' ORDER BY entry_id"
    )
    assert data["rows"] == [
        ["after", "blocked"],
        ["clash", "conflict"],
        ["stays", "clean"],
        ["tail", "drift"],
        ["upstreamed", "superseded"],
    ]


def test_suggest_prefers_verified_entries(stock_home_copy):
    home = stock_home_copy
    for entry_id, status in (("sure", "verified"), ("maybe", "candidate"), ("gone", "superseded")):
        meta = {
            **DRAFT,
            "status": status,
            "scope": {"sglang": "0.5.23"},
            "evidence": [{**evidence("H200", "batch", "DFlash2"), "kind": "paired-run", "synthetic": False}],
        }
        record_entry(
            home, entry_id, source_on(home, [], {f"sglang/srt/{entry_id}.py": b"X = 1\n"}), requires=[], meta=meta
        )
    setting = (
        "--gpu",
        "H200",
        "--model",
        "Qwen3.8-27B",
        "--drafter",
        "DFlash2",
        "--regime",
        "batch",
        "--batch-sizes",
        "8",
        "--suggest",
        "--dry-run",
    )
    code, data = cli(home, "deploy", "new", "pick", *setting)
    assert code == 0 and [s["id"] for s in data["suggestions"]] == ["sure", "maybe"]
    assert "verified on SGLang 0.5.23" in data["suggestions"][0]["reasons"]
    assert any("a candidate on SGLang 0.5.23" in f for f in data["suggestions"][1]["flags"])
    assert [s["id"] for s in data["left_out"]] == ["gone"] and "verified entries preferred" in data["preference"]
    code, data = cli(home, "deploy", "new", "pick", *setting, "--verified-only")
    assert [s["id"] for s in data["suggestions"]] == ["sure"] and {s["id"] for s in data["left_out"]} == {
        "gone",
        "maybe",
    }


@pytest.mark.parametrize(
    "case, message",
    [
        ("unknown", "sglang==9.9.9 is not a pinned release"),
        ("missing", "no wheel at"),
        ("not-a-zip", "is not a readable wheel"),
        ("not-sglang", "not of SGLang"),
        ("bad-hash", "not the pinned"),
        ("layout", "has no sglang/srt/ package"),
        ("unknown-entry", "unknown entry 'nope'"),
    ],
)
def test_bad_release_input_writes_nothing(memory, tmp_path, case, message):
    home, wheel = memory
    spec = {"unknown": "sglang==9.9.9", "missing": str(tmp_path / "gone.whl")}.get(case, str(wheel))
    ids = ["nope"] if case == "unknown-entry" else ["tail"]
    if case == "not-a-zip":
        spec = str(tmp_path / "sglang-0.5.20-cp311-cp311-manylinux_2_34_x86_64.whl")
        (tmp_path / spec).write_bytes(b"not a zip")
    elif case == "not-sglang":
        spec = str(make_release_wheel(tmp_path / "other-1.0-py3-none-any.whl", {"other/srt/x.py": b""}, "other", "1.0"))
    elif case == "bad-hash":  # claims to be the pinned 0.5.20, with other bytes
        spec = str(
            make_release_wheel(
                tmp_path / releases_module.PINS["0.5.20"].wheel, {"sglang/srt/x.py": b""}, version="0.5.20"
            )
        )
    elif case == "layout":
        spec = str(
            make_release_wheel(tmp_path / "sglang-1.0-py3-none-any.whl", {"sglang/runtime/x.py": b""}, version="1.0")
        )
    before = snapshot(home)
    for verb in (
        ["apply", *ids, "--onto", spec],
        ["port", *ids, "--onto", spec],
        ["revalidate", "--release", spec] if case != "unknown-entry" else ["apply", *ids, "--onto", str(wheel)],
    ):
        code, data = cli(home, *verb)
        assert code == 2 and message in data["what"], (verb, data)
        assert data["fix"]
        assert snapshot(home) == before


def test_status_is_a_schema_field_with_defaults():
    base = {
        "id": "x",
        "title": "t",
        "summary": "s",
        "contract": {"level": "bit-exact", "statement": "s"},
        "reproduces": "0" * 40,
    }
    record = EntryRecord.model_validate(base)
    assert (record.status, record.scope.sglang, record.releases) == ("candidate", None, [])
    with pytest.raises(ValueError, match="names the release it was verified on"):
        EntryRecord.model_validate({**base, "status": "verified"})
    check = {"release": "0.5.20", "status": "candidate", "verdict": "drift", "base": "1" * 40, "checked": "2026-12-01"}
    with pytest.raises(ValueError, match="lists a release twice"):
        EntryRecord.model_validate({**base, "releases": [check, check]})
    with pytest.raises(ValueError, match="the release of the entry's scope"):
        EntryRecord.model_validate({**base, "scope": {"sglang": "0.5.20"}, "releases": [check]})
    assert EntryRecord.model_validate({**base, "releases": [check]}).status_on("0.5.20") == "candidate"


def test_project_entries_carry_status_scope_and_release_verdicts():
    from pathlib import Path

    from specpilot_mem.home import Home
    from specpilot_mem.store.records import load_entries

    records = load_entries(Home(Path(__file__).resolve().parents[1]))
    for entry_id in ("options", "w12", "certified-head", "gdn-tree"):
        record = records[entry_id]
        assert record.status == "verified" and record.scope.sglang == "0.5.23"
        assert [r.release for r in record.releases] == ["0.5.20", "0.5.21", "0.5.22"]
        assert {r.base for r in record.releases} == {
            releases_module.PINS[v].commit for v in ("0.5.20", "0.5.21", "0.5.22")
        }
