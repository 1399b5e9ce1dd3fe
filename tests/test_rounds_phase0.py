"""Phase 0's report reads the profile and lattices a system names and gives the cost model's factors."""

from __future__ import annotations

import datetime as dt
import json

from specpilot_mem.replay.lattice import save_lattice
from specpilot_mem.replay.synthetic import SyntheticSpec, generate
from specpilot_mem.rounds.files import RoundDir
from specpilot_mem.rounds.models import RoundConfig, RoundState
from specpilot_mem.rounds.phase0 import cost_model_report
from tests.test_costmodel_ceiling import APPENDIX_B_PROFILE

COMMIT = "1" * 40


def _state(tmp_path) -> RoundState:
    config = RoundConfig(system_repo=str(tmp_path), requests=str(tmp_path / "r.jsonl"), devices=["cpu"])
    return RoundState(
        deployment="d",
        number=1,
        config=config,
        start=COMMIT,
        lineage="round/d/1",
        best=COMMIT,
        stock=COMMIT,
        started=dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc),
    )


def _round_dir(tmp_path) -> RoundDir:
    round_dir = RoundDir(tmp_path / "round")
    round_dir.write_json("measurements/calibrate-0.json", {"delta": 0.25, "noise": {"noise": 0.004}})
    return round_dir


def test_report_has_the_ceiling_factors_when_the_system_names_its_profile(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "bench").mkdir(parents=True)
    (checkout / "bench" / "profile.json").write_text(json.dumps(APPENDIX_B_PROFILE))
    save_lattice(
        generate(SyntheticSpec(requests=2, length=64, positions=8, vocab=1000)), checkout / "bench" / "lat.npz"
    )
    (checkout / "specpilot-system.json").write_text(
        json.dumps(
            {"adapter": "python", "module": "system.py", "profile": "bench/profile.json", "lattices": ["bench/lat.npz"]}
        )
    )
    report = cost_model_report(None, checkout, _state(tmp_path), _round_dir(tmp_path))
    assert report["delta"] == 0.25 and report["noise"] == 0.004
    ceiling = report["ceiling"]
    assert set(ceiling["factors"]) == {"tau", "kernel", "overhead"}
    assert ceiling["leading"] in ceiling["factors"]
    assert ceiling["synthetic"] is True


def test_report_says_why_there_is_no_ceiling(tmp_path):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "specpilot-system.json").write_text(json.dumps({"adapter": "python", "module": "system.py"}))
    report = cost_model_report(None, checkout, _state(tmp_path), _round_dir(tmp_path))
    assert report["ceiling"] is None and "profile" in report["why"]
