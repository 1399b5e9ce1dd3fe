"""The command line's error contract: usage errors as data under --json (exit 2, told apart from domain
errors by their type), and a defect printed as one line with the traceback in a log (exit 3)."""

from __future__ import annotations

import json

from specpilot_mem.commands import verify as verify_command
from specpilot_mem.errors import EXIT_DEFECT, EXIT_ERROR
from specpilot_mem.main import main


def test_a_usage_error_is_json_under_json(capsys):
    assert main(["apply", "--json", "--no-such-option"]) == EXIT_ERROR
    data = json.loads(capsys.readouterr().out)
    assert data["error"] == "UsageError" and "--no-such-option" in data["what"] and data["fix"]


def test_a_usage_error_names_the_verb_and_help(capsys):
    assert main(["query", "--regime", "sideways"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "invalid choice: 'sideways'" in err and "specpilot-mem query --help" in err


def test_a_domain_error_has_its_own_type(capsys, tmp_path):
    assert main(["show", "nothing-here", "--json", "--home", str(tmp_path)]) == EXIT_ERROR
    assert json.loads(capsys.readouterr().out)["error"] not in ("UsageError", "InternalError")


def test_a_defect_is_one_line_and_the_traceback_goes_to_the_log(capsys, tmp_path, monkeypatch):
    def broken(args):
        raise ZeroDivisionError("a bug")

    log = tmp_path / "logs" / "specpilot.log"
    monkeypatch.setenv("SPECPILOT_LOG", str(log))
    monkeypatch.setattr(verify_command, "run", broken)
    assert main(["verify"]) == EXIT_DEFECT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ZeroDivisionError: a bug" in err and str(log) in err
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "command: specpilot-mem verify" in text
    assert main(["verify", "--json"]) == EXIT_DEFECT
    assert json.loads(capsys.readouterr().out)["error"] == "InternalError"


def test_no_command_under_json_is_a_usage_error(capsys):
    assert main(["--json"]) == EXIT_ERROR
    assert json.loads(capsys.readouterr().out)["error"] == "UsageError"
    assert main([]) == EXIT_ERROR and "usage: specpilot-mem" in capsys.readouterr().out
