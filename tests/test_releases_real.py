"""The real SGLang 0.5.20 wheel (downloaded once into the wheel cache): its import gives the pinned ids, and
the port check of this project's entries gives the verdicts committed in their records."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from specpilot_mem.store import releases
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.port import check_release
from specpilot_mem.store.records import load_entries

pytestmark = pytest.mark.release_wheels
PROJECT = Path(__file__).resolve().parents[1]
RELEASE = "0.5.20"


def test_real_release_import_and_committed_verdicts(stock_fork_home, tmp_path):
    from conftest import _shared_fork_home

    root = tmp_path / "home"
    (root / "entries").mkdir(parents=True)
    for record in sorted((PROJECT / "entries").glob("*/entry.yaml")):
        shutil.copytree(
            record.parent, root / "entries" / record.parent.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    home = _shared_fork_home(stock_fork_home, root)
    report = check_release(home, f"sglang=={RELEASE}")
    pin = releases.PINS[RELEASE]
    assert (report.release.commit, report.release.tree, report.release.sha256) == (pin.commit, pin.tree, pin.sha256)
    records = load_entries(home)
    for verdict in report.entries:
        check = records[verdict.id].release_check(RELEASE)
        if check is None:  # an entry recorded after the last `revalidate --release 0.5.20`
            continue
        assert (verdict.verdict, verdict.changed, verdict.conflicts) == (
            check.verdict,
            check.changed,
            check.conflicts,
        ), verdict.id
        assert check.base == pin.commit
    # a second check finds the release already imported: no wheel is read
    assert releases.known_release(open_fork(home), RELEASE) == report.release
