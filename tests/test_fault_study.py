"""The fault study's tallies against the issue's targets (benchmarks/fault_study.py), on hand-made runs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fault_study  # noqa: E402


def _run(seed: int, verdicts: dict[str, str], effects: dict[str, tuple[float, float, int]]) -> dict:
    return {
        "seed": seed,
        "verdicts": {n: {"verdict": v} for n, v in verdicts.items()},
        "effects": {
            n: {"excess_mismatch": e, "events_per_1000": k, "shorter_requests": s, "changed_requests": 1}
            for n, (e, k, s) in effects.items()
        },
    }


def test_rates_hold_each_fault_to_its_target_by_its_real_size():
    runs = [
        _run(
            seed,
            {
                "splitk-head": "inconclusive",
                "int4-all": "reject",
                "int8-all": "inconclusive",
                "flip-0.1%": "accept" if seed == 0 else "reject",
            },
            {"int4-all": (0.04, 40.0, 0), "int8-all": (0.001, 0.5, 0), "flip-0.1%": (0.001, 1.2, 0)},
        )
        for seed in range(4)
    ]
    table = fault_study.rates(runs)
    assert table["splitk-head"] == {
        "kind": "control",
        "runs": 4,
        "reject": 0,
        "inconclusive": 4,
        "accept": 0,
        "reject_rate": 0.0,
        "meets_target": True,
    }
    assert table["int4-all"]["target_size"] and table["int4-all"]["meets_target"]
    assert not table["int8-all"]["target_size"] and table["int8-all"]["meets_target"]  # small: inconclusive is fine
    assert table["flip-0.1%"]["target_size"] and not table["flip-0.1%"]["meets_target"]  # 1.2 events / 1,000: 3 of 4
    text = fault_study.headline({"systems": table})
    assert "controls rejected in 0 of 4" in text and "rejected in 7 of 8" in text and "accepted in 1" in text
