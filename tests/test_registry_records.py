"""The registry over this project's real entry records (entries/ as they are): every record is indexed
with its requirements, evidence and variants, and `query` finds each one by title, arch and requirement."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specpilot_mem.home import Home
from specpilot_mem.registry.query import QueryFilters, query_entries
from specpilot_mem.registry.sync import connect, sync
from specpilot_mem.store.records import load_entries

PROJECT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def project_records(tmp_path_factory):
    root = tmp_path_factory.mktemp("project-records")
    for record in sorted((PROJECT / "entries").glob("*/entry.yaml")):
        (root / "entries" / record.parent.name).mkdir(parents=True)
        shutil.copy(record, root / "entries" / record.parent.name / "entry.yaml")
    home = Home(root)
    records = load_entries(home)
    assert records, "the project's entries/ holds no records"
    sync(home)
    return home, records


def test_every_record_is_indexed(project_records):
    home, records = project_records
    con = connect(home)
    try:
        for entry_id, record in records.items():
            assert con.execute("SELECT title FROM entries WHERE id = ?", [entry_id]).fetchone() == (record.title,)
            assert [
                r[0]
                for r in con.execute(
                    "SELECT requires_id FROM requirements WHERE entry_id = ? ORDER BY position", [entry_id]
                ).fetchall()
            ] == record.requires
            assert con.execute("SELECT count(*) FROM evidence WHERE entry_id = ?", [entry_id]).fetchone() == (
                len(record.evidence),
            )
            assert con.execute("SELECT count(*) FROM options WHERE entry_id = ?", [entry_id]).fetchone() == (
                len(record.options),
            )
    finally:
        con.close()


def test_query_finds_each_record(project_records):
    home, records = project_records
    con = connect(home)
    try:
        for entry_id, record in records.items():
            word = max(record.title.split(), key=len)
            assert entry_id in {m.id for m in query_entries(con, QueryFilters(text=word))}
            for arch in record.arches() - {"cpu"}:  # CPU evidence has no GPU to query by (`--gpu cpu` is refused)
                assert entry_id in {m.id for m in query_entries(con, QueryFilters(gpu=arch))}
            for required in record.requires:
                assert entry_id in {m.id for m in query_entries(con, QueryFilters(requires=required))}
    finally:
        con.close()
