"""User data is never rendered as rich markup: ids, paths and record text that look like markup come out
exactly as written, through every verb, in errors and in tables."""

from __future__ import annotations

import pytest
from test_store_support import DRAFT, prefixed_source, synthetic_home

from specpilot_mem.main import main
from specpilot_mem.store import record_entry

MARKUP = "[red]x[/red]"
BROKEN = "[/]"
LONG_PATH = (
    "sglang/" + "deeply_nested_folder/" * 8 + "a_module_with_a_long_name.py"
)  # far wider than 80 columns  # rich raises MarkupError on this, if it ever parses it


def run_cli(capsys, argv: list[str]) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# (argv, the text that must appear verbatim); each runs in the home of the project's entries
VERBS = [
    (["apply", BROKEN], f"unknown entry '{BROKEN}'"),
    (["apply", MARKUP], f"unknown entry '{MARKUP}'"),
    (["apply", "options", "--onto", MARKUP], MARKUP),
    (["show", MARKUP], MARKUP),
    (["graph", MARKUP], MARKUP),
    (["port", MARKUP, "--onto", "sglang==0.5.20"], MARKUP),
    (["record", MARKUP, "--from", "stock"], MARKUP),
    (["record", "fresh-entry", "--from", MARKUP], MARKUP),
    (["record", "options", "--from", "stock", "--requires", MARKUP], MARKUP),
    (["entry", "set-status", MARKUP, "candidate"], MARKUP),
    (["entry", "rerecord", MARKUP, "--from", "stock"], MARKUP),
    (["round", "status", MARKUP], MARKUP),
    (["serve", MARKUP, "--dry-run"], MARKUP),
    (["replay", f"{MARKUP}.npz"], f"{MARKUP}.npz"),
    (["revalidate", "--release", MARKUP], MARKUP),
    (["query", "--gpu", MARKUP], MARKUP),
    (["query", "--text", MARKUP], MARKUP),
    (["query", "--requires", MARKUP], MARKUP),
    (["sql", f"SELECT '{MARKUP}' AS v"], MARKUP),
    (["sql", f"SELECT * FROM {BROKEN}"], BROKEN),
    (["deploy", "new", "d1", "--gpu", MARKUP, "--model", "m", "--drafter", "d", "--regime", "single"], MARKUP),
    (["deploy", "export", MARKUP, "out"], MARKUP),
    (["ceiling", f"{MARKUP}.json", "--lattices", f"{MARKUP}.npz"], MARKUP),
    (
        ["tf", "--requests", f"{MARKUP}.jsonl", "--stock", "s", "--system", "a=b", "--delta", "1", "--scorer", "m:f"],
        f"{MARKUP}.jsonl",
    ),
    (["schema", MARKUP], MARKUP),
    (["registry", "sync", "--home", f"{MARKUP}-home"], f"{MARKUP}-home"),
    (["show", "gdn-tree"], "([layers, rows, draft tokens, HV, V, K])"),
]


@pytest.mark.parametrize("argv,verbatim", VERBS, ids=[" ".join(v[0][:2]) for v in VERBS])
def test_markup_looking_input_comes_out_as_written(project_entries_home, capsys, monkeypatch, tmp_path, argv, verbatim):
    monkeypatch.chdir(tmp_path)  # relative paths (out, ...) name nothing there
    monkeypatch.setenv("SPECPILOT_HOME", str(project_entries_home.root))
    code, text = run_cli(capsys, argv)
    assert verbatim in text, text
    assert "Traceback" not in text and code in (0, 1, 2)


@pytest.fixture(scope="module")
def markup_home(tmp_path_factory):
    """A user fork with an entry whose title, summary and file path look like markup."""
    home = synthetic_home(tmp_path_factory.mktemp("markup"))
    draft = {**DRAFT, "title": f"title {MARKUP}", "summary": "keeps [layers, rows] and [bold]this[/bold]"}
    record_entry(
        home, "marked", prefixed_source(home, [], {f"sglang/{MARKUP}.py": b"X = 1\n"}), requires=[], meta=draft
    )
    record_entry(home, "long-path", prefixed_source(home, [], {LONG_PATH: b"Y = 2\n"}), requires=[], meta=DRAFT)
    return home


@pytest.mark.parametrize(
    "argv,verbatim",
    [
        (["show", "marked"], f"title {MARKUP}"),
        (["show", "marked"], "keeps [layers, rows] and [bold]this[/bold]"),
        (["apply", "marked"], f"sglang/{MARKUP}.py"),
        (["verify"], "marked"),
        (["graph"], "marked"),
        (["query", "--text", "title"], f"title {MARKUP}"),
        (["apply", "long-path"], LONG_PATH),  # piped output is not cut at 80 columns
    ],
)
def test_record_text_and_paths_come_out_as_written(markup_home, capsys, argv, verbatim):
    code, text = run_cli(capsys, [*argv, "--home", str(markup_home.root)])
    assert code == 0 and verbatim in text, text


def test_long_values_are_printed_whole_and_unstyled(markup_home, capsys):
    """A 20,000-character filter value comes back whole: no width cut, and no repr highlighting (whose
    regular expressions are quadratic in the length of a value)."""
    from specpilot_mem.output import console

    long_value = "x1.5e3" * 3500
    code, text = run_cli(capsys, ["query", "--model", long_value, "--home", str(markup_home.root)])
    assert code == 0 and long_value in text
    assert console._highlight is False  # rich keeps the setting private
