"""The fault study's tallies against the issue's targets (benchmarks/fault_study.py), on hand-made runs."""

from __future__ import annotations

import json
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


def test_sealed_sample_constant_is_the_unseen_split_with_long_outputs():
    """SEALED_TOKENS (kept as a number: the GPU machine has no tokenizer) is what the long-output pass gives the
    unseen split of the project's request set with the trained pair."""
    import pytest

    pytest.importorskip("tokenizers")
    from specpilot_mem.controller.requests import load_requests
    from specpilot_mem.engine.engine import Engine
    from specpilot_mem.engine.weights import has_trained_pair
    from specpilot_mem.forcing.engine_adapter import prompt_encoder
    from specpilot_mem.forcing.scorer import long_output_requests

    if not has_trained_pair():
        pytest.skip("needs the trained pair")
    engine = Engine.load_default()
    unseen = [r for r in load_requests(fault_study.ROOT / "requests" / "specpilot-v1.jsonl") if r.split == "unseen"]
    long = long_output_requests(unseen, engine.max_len, prompt_encoder(engine))
    assert (len(long), sum(r.max_new_tokens for r in long)) == (fault_study.SEALED_REQUESTS, fault_study.SEALED_TOKENS)


def test_target_size_counts_the_events_a_fault_adds_to_stocks():
    run = _run(0, {"int8-all": "inconclusive"}, {"int8-all": (0.0005, 4.0, 0)})
    run["tokens"] = 1000
    run["verdicts"]["int8-all"].update(stock_events=4, events=4, audited=4, unexplained=0)
    row = fault_study.rates([run])["int8-all"]
    assert row["mean_added_events_per_1000"] == 0.0 and not row["target_size"]  # stock has as many
    assert row["sealed_event_power"] == 0.0  # none unexplained: the event rule has nothing to see


def test_faults_on_a_share_of_requests_pick_the_pure_engines_requests():
    """The system study serves a request-confined fault on the requests the pure-torch engine applies it to."""
    import torch

    from specpilot_mem.controller.requests import Request
    from conftest import tiny_pair
    from specpilot_mem.engine.config import EngineOptions
    from specpilot_mem.engine.engine import Engine, Request as EngineRequest

    target, drafter = tiny_pair(vocab_size=64)
    engine = Engine.random(0, target, drafter, options=EngineOptions(positions=4, flip_rate=0.1, fault_requests=0.25))
    prompts = [torch.randint(0, 64, (6,), generator=torch.Generator().manual_seed(i)).tolist() for i in range(40)]
    requests = [Request(f"r{i}", "code", "dev", 8, prompt_ids=tuple(p)) for i, p in enumerate(prompts)]
    chosen = set()
    for r in requests:
        engine._start_request(EngineRequest(list(r.prompt_ids), 8, r.id))
        if engine._faulty:
            chosen.add(r.id)
    assert fault_study.faulty_requests(requests, 0.25) == chosen and 0 < len(chosen) < 40


def test_merge_joins_one_seeds_runs_from_two_leases(tmp_path):
    first = _run(0, {"fp8-head": "accept"}, {"fp8-head": (0.0003, 0.2, 0)})
    second = _run(0, {"int4-all": "reject"}, {"int4-all": (0.04, 40.0, 0)})
    paths = []
    for index, run in enumerate((first, second)):
        run["requests"] = ["fs-001", "fs-002"]
        path = tmp_path / f"part{index}.json"
        path.write_text(json.dumps({"runs": [run], "wall_seconds": 1.0, "command": f"call {index}"}))
        paths.append(str(path))
    doc = fault_study.merge(paths)
    assert len(doc["runs"]) == 1 and set(doc["runs"][0]["verdicts"]) == {"fp8-head", "int4-all"}
    assert doc["systems"]["int4-all"]["reject"] == 1 and doc["merged_from"] == ["call 0", "call 1"]
