"""Entry records as YAML: canonical round trips, and errors that name file, line and field."""

from __future__ import annotations

import datetime as dt

import pytest

from specpilot_mem.errors import RecordError, UnknownEntryError
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord
from specpilot_mem.store.records import dump_record, load_entries, load_entry, parse_record, save_entry

FULL = {
    "id": "w12",
    "title": "W12 weights",
    "summary": "Twelve-bit weights.\nDecoded in registers.\n",
    "requires": ["options"],
    "options": [{"name": "--specpilot-w12", "type": "bool", "default": False, "help": "use W12"}],
    "variants": [{"name": "hopper", "options": {"--specpilot-w12": True}, "hardware": ["sm_90"]}],
    "contract": {"level": "bit-exact", "statement": "decode is bit-for-bit", "commands": ["pytest tests/test_w12.py"]},
    "evidence": [
        {
            "kind": "microbenchmark",
            "deployment": {"gpu": "H200", "arch": "sm_90", "batch_sizes": [1, 8]},
            "figures": [{"name": "speedup", "value": 1.31, "ci_low": 1.2, "ci_high": 1.4}],
            "command": "python benchmarks/w12_bench.py",
            "date": dt.date(2026, 11, 30),
            "synthetic": True,
        }
    ],
    "limits": ["needs sm_90"],
    "reproduces": "a" * 40,
    "kernels": {"sglang/srt/specpilot/kernels/w12/gemm.py": "b" * 64},
    "recorded": dt.date(2026, 11, 30),
}


def test_dump_load_round_trip_without_churn(tmp_path):
    record = EntryRecord.model_validate(FULL)
    text = dump_record(record)
    again = parse_record(text, EntryRecord, "entry.yaml")
    assert again == record and dump_record(again) == text
    assert "summary: |" in text and "date: 2026-11-30" in text


def test_save_writes_only_on_change(tmp_path):
    home = Home(tmp_path)
    (tmp_path / "entries").mkdir()
    record = EntryRecord.model_validate(FULL)
    assert save_entry(home, record) is True
    mtime = (tmp_path / "entries/w12/entry.yaml").stat().st_mtime_ns
    assert save_entry(home, record) is False
    assert (tmp_path / "entries/w12/entry.yaml").stat().st_mtime_ns == mtime
    assert load_entries(home) == {"w12": record}


@pytest.mark.parametrize(
    "edit, line, field",
    [
        (lambda t: t.replace("arch: sm_90\n", "arch: hopper\n", 1), "deployment.arch", "evidence.0.deployment.arch"),
        (lambda t: t.replace("level: bit-exact", "level: exact-ish"), "level", "contract.level"),
        (lambda t: t.replace("limits:", "limitz:"), "limitz", "limitz"),
        (lambda t: t.replace("reproduces: " + "a" * 40, "reproduces: abc"), "reproduces", "reproduces"),
    ],
)
def test_invalid_fields_name_file_line_and_field(tmp_path, edit, line, field):
    text = edit(dump_record(EntryRecord.model_validate(FULL)))
    expected_line = next(
        n for n, text_line in enumerate(text.splitlines(), 1) if text_line.strip().startswith(line.split(".")[-1] + ":")
    )
    with pytest.raises(RecordError) as err:
        parse_record(text, EntryRecord, "entries/w12/entry.yaml")
    assert f"entries/w12/entry.yaml:{expected_line}: {field}" in err.value.where


def test_malformed_yaml_names_the_line(tmp_path):
    with pytest.raises(RecordError, match="malformed YAML") as err:
        parse_record("id: x\ntitle: [unclosed\nsummary: s\n", EntryRecord, "e.yaml")
    assert err.value.where.startswith("e.yaml:")


def test_folder_and_id_must_agree_and_unknown_ids_are_clear(tmp_path):
    home = Home(tmp_path)
    save_entry(home, EntryRecord.model_validate(FULL))
    (tmp_path / "entries/w12").rename(tmp_path / "entries/w13")
    with pytest.raises(RecordError, match="does not match its folder") as err:
        load_entry(home, "w13")
    assert err.value.where.endswith("entry.yaml:2")
    with pytest.raises(UnknownEntryError, match="unknown entry 'nope'"):
        load_entry(home, "nope")
