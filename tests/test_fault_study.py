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
    assert table["flip-0.1%"]["target_instances_missed"] == [0] and table["int8-all"]["target_instances"] == 0
    text = fault_study.headline({"systems": table})
    assert "controls rejected in 0 of 4" in text and "target size rejected in 7 of 8" in text
    assert "below it 0 rejected, 4 inconclusive, 0 accepted" in text


def test_the_target_holds_per_instance_of_a_fault_at_the_verdicts_delta():
    """A fault confined to a quarter of the requests that missed a seed's requests is below the target there: its
    accept, with the power to see the target size, is no miss; a seed where it was of the target size and was not
    rejected is. The events an instance adds count at the verdict's δ (the first departures' are reported too)."""
    sizes = [(0.01, 5.0, 5.0), (0.0, 0.0, 0.0), (0.001, 0.0, 1.5)]  # excess, added at δ, added at first departures
    runs = []
    for seed, ((excess, at_delta, first), verdict) in enumerate(zip(sizes, ("reject", "accept", "accept"))):
        run = _run(seed, {"int4-all-quarter-of-requests": verdict}, {})
        found = {
            "excess_mismatch": excess,
            "events_per_1000": first,
            "stock_events_per_1000": 0.0,
            "events_per_1000_at_delta": at_delta,
            "stock_events_per_1000_at_delta": 0.0,
            "changed_requests": 1,
            "shorter_requests": 0,
        }
        found["target_size"] = fault_study.of_target_size(found)
        found["target_size_first_departure"] = fault_study.of_target_size(found, first_departure=True)
        run["effects"]["int4-all-quarter-of-requests"] = found
        run["verdicts"]["int4-all-quarter-of-requests"]["sufficient"] = True
        runs.append(run)
    row = fault_study.rates(runs)["int4-all-quarter-of-requests"]
    assert (row["target_instances"], row["target_instances_rejected"], row["meets_target"]) == (1, 1, True)
    assert row["below_target"] == {"reject": 0, "inconclusive": 0, "accept": 2} and row["bare_accepts"] == []
    assert (row["first_departure_target_instances"], row["first_departure_target_instances_rejected"]) == (2, 1)
    runs[0]["verdicts"]["int4-all-quarter-of-requests"]["verdict"] = "inconclusive"  # the one of target size missed
    row = fault_study.rates(runs)["int4-all-quarter-of-requests"]
    assert row["target_instances_missed"] == [0] and not row["meets_target"]


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


def test_a_small_fault_may_be_accepted_only_where_the_power_could_have_seen_it():
    runs = []
    for seed, sufficient in enumerate((True, False)):
        run = _run(seed, {"int8-all": "accept"}, {"int8-all": (0.0002, 0.1, 0)})
        run["verdicts"]["int8-all"]["sufficient"] = sufficient
        runs.append(run)
    assert fault_study.rates(runs[:1])["int8-all"]["meets_target"]  # the power statement says it could see
    assert not fault_study.rates(runs)["int8-all"]["meets_target"]  # a bare accept


def test_outputs_of_several_workers_join_by_request_and_shared_faults_get_stocks_rest(tmp_path):
    """Workers of the sealed stage write gzip'd outputs of different systems (or different seeds of one system);
    --from-outputs joins them, and a fault served on a share of the requests gets stock's outputs elsewhere."""
    from types import SimpleNamespace

    from specpilot_mem.controller.system import RequestOutput

    args = SimpleNamespace(requests_per_seed=2, max_new_tokens=3, dtype="float32")

    def outs(ids, token):
        return {rid: RequestOutput(rid, (token,) * 3) for rid in ids}

    first, second = tmp_path / "w0.json.gz", tmp_path / "w1.json"
    labels = {"stock": "positions=8", "tree": "tree=ddtree", "few": "positions=8,fault_requests=0.25"}
    fault_study.write_outputs(
        str(first), [0], args, {"stock": outs(["a", "b", "c"], 1), "tree": outs(["a"], 2)}, {"stock": 1.0}, labels
    )
    fault_study.write_outputs(
        str(second), [1], args, {"tree": outs(["a", "b", "c"], 3), "few": outs(["b"], 4)}, {"tree": 2.0}, labels
    )
    assert first.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    outputs, seconds, read_labels = fault_study.read_outputs([str(first), str(second)], args)
    assert [outputs["tree"][r].output_ids[0] for r in "abc"] == [2, 3, 3]  # the first file's output kept
    full = fault_study.with_unfaulted(outputs, read_labels)
    assert [full["few"][r].output_ids[0] for r in "abc"] == [1, 4, 1] and full["tree"] is outputs["tree"]
    assert seconds == {"stock": 1.0, "tree": 2.0}
    import pytest

    with pytest.raises(SystemExit, match="served at"):
        fault_study.read_outputs([str(first)], SimpleNamespace(requests_per_seed=12, max_new_tokens=3))
