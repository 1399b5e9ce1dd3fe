"""Builders for the registry tests: small hand-made entry records with exactly the evidence a test needs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb

from specpilot_mem.gpus import find_gpu
from specpilot_mem.home import Home
from specpilot_mem.models import EntryRecord
from specpilot_mem.store.records import save_entry


def evidence(
    gpu: str,
    regime: str = "single",
    drafter: str = "DFlash2",
    target: str = "Qwen3.8-27B",
    *,
    kind: str = "paired-run",
    synthetic: bool = False,
    verdict: str | None = "accept",
    gain: float = 1.05,
) -> dict:
    return {
        "kind": kind,
        "deployment": {
            "gpu": gpu,
            "arch": find_gpu(gpu).arch,
            "target": target,
            "drafter": drafter,
            "regime": regime,
            "batch_sizes": [1] if regime == "single" else [8, 16],
        },
        "figures": [{"name": "gain", "value": gain, "unit": "x", "ci_low": gain - 0.01, "ci_high": gain + 0.01}],
        "verdict": verdict,
        "command": "python -m pytest tests/test_registry_query.py  # hand-made test record",
        "date": "2026-11-01",
        "synthetic": synthetic,
    }


def entry(
    entry_id: str,
    *,
    evidence_items: list[dict] = (),
    variants: dict[str, list[str]] | None = None,
    requires: list[str] = (),
    untested: list[dict] = (),
    title: str | None = None,
    summary: str = "",
    limits: list[str] = (),
) -> EntryRecord:
    option = f"--specpilot-{entry_id}"
    return EntryRecord.model_validate(
        {
            "id": entry_id,
            "title": title or f"mechanism {entry_id}",
            "summary": summary or f"what {entry_id} does",
            "requires": list(requires),
            "options": [{"name": option, "type": "bool", "default": False, "help": f"enable {entry_id}"}],
            "variants": [
                {"name": name, "options": {option: True}, "hardware": arches}
                for name, arches in (variants or {}).items()
            ],
            "contract": {"level": "bit-exact", "statement": f"{entry_id} changes no output bit"},
            "evidence": list(evidence_items),
            "limits": list(limits),
            "untested": list(untested),
            "reproduces": hashlib.sha1(entry_id.encode()).hexdigest(),
        }
    )


def write_home(root: Path, records: list[EntryRecord]) -> Home:
    (root / "entries").mkdir(parents=True, exist_ok=True)
    home = Home(root)
    for record in records:
        save_entry(home, record)
    return home


def table_contents(db: Path) -> dict[str, list]:
    """Every table's rows (sorted, as text) except ``meta``: what an incremental sync and a rebuild must agree on."""
    con = duckdb.connect(":memory:")
    try:
        con.execute("ATTACH ? AS registry (READ_ONLY)", [str(db)])
        con.execute("USE registry")
        tables = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = 'registry' AND table_name <> 'meta'"
            ).fetchall()
        ]
        return {t: sorted(map(repr, con.execute(f"SELECT * FROM {t}").fetchall())) for t in tables}
    finally:
        con.close()
