"""Every entry's contract commands name test files that exist (a contract nobody can run is no contract)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from specpilot_mem.home import Home
from specpilot_mem.store.records import load_entries

PROJECT = Path(__file__).resolve().parents[1]
RECORDS = load_entries(Home(PROJECT))


@pytest.mark.parametrize("entry_id", sorted(RECORDS))
def test_contract_commands_name_existing_files(entry_id):
    commands = RECORDS[entry_id].contract.commands
    assert commands, f"{entry_id} has no contract command"
    for command in commands:
        words = shlex.split(command)
        named = [w.split("::")[0].rstrip("),;") for w in words if w.startswith(("tests/", "benchmarks/", "scripts/"))]
        assert named, f"{entry_id}: {command!r} names no file"
        missing = [w for w in named if not (PROJECT / w).exists()]
        assert not missing, f"{entry_id}: {command!r} names missing files {missing}"
