"""The request-set format: the project's set loads, and every malformed line is a file:line error."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from specpilot_mem.controller.requests import RequestSetError, load_requests, require_split
from specpilot_mem.controller.system import RequestOutput, load_outputs, write_outputs

PROJECT_SET = Path(__file__).resolve().parents[1] / "requests" / "specpilot-v1.jsonl"


def test_project_set_has_dev_and_unseen_requests_for_every_benchmark():
    requests = load_requests(PROJECT_SET)
    counts = Counter((r.benchmark, r.split) for r in requests)
    benchmarks = {r.benchmark for r in requests}
    assert len(benchmarks) >= 3
    for benchmark in benchmarks:
        assert counts[(benchmark, "dev")] >= 2 and counts[(benchmark, "unseen")] >= 2
    unseen = load_requests(PROJECT_SET, split="unseen", benchmarks=["code"])
    assert unseen and all(r.split == "unseen" and r.benchmark == "code" for r in unseen)
    dev_prompts = {r.prompt for r in requests if r.split == "dev"}
    assert not dev_prompts & {r.prompt for r in requests if r.split == "unseen"}


GOOD = {"id": "a-1", "benchmark": "code", "split": "dev", "prompt": "hi", "max_new_tokens": 8}


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps([1, 2]), "must be a JSON object"),
        (json.dumps({**GOOD, "extra": 1}), "unknown field"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "split"}), "missing field 'split'"),
        (json.dumps({**GOOD, "split": "test"}), "bad split"),
        (json.dumps({**GOOD, "benchmark": "Code Bench"}), "bad benchmark name"),
        (json.dumps({**GOOD, "max_new_tokens": 0}), "max_new_tokens"),
        (json.dumps({**GOOD, "prompt_ids": [1, 2]}), "exactly one of"),
        (json.dumps({k: v for k, v in {**GOOD, "prompt_ids": [1, -2]}.items() if k != "prompt"}), "non-negative"),
        (json.dumps(GOOD), "duplicate id 'a-1' (first on line 1)"),
    ],
)
def test_malformed_lines_name_the_file_and_line(tmp_path, line, message):
    path = tmp_path / "set.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + line + "\n")
    with pytest.raises(RequestSetError) as err:
        load_requests(path)
    assert message in err.value.what
    assert err.value.where == f"{path}:3" and err.value.fix


def test_missing_file_and_unknown_benchmark(tmp_path):
    with pytest.raises(RequestSetError, match="does not exist"):
        load_requests(tmp_path / "none.jsonl")
    with pytest.raises(RequestSetError, match="not in"):
        load_requests(PROJECT_SET, benchmarks=["chess"])


def test_token_ids_from_ids_or_an_encoder():
    requests = load_requests(PROJECT_SET, split="dev")
    text = requests[0]
    assert text.token_ids(lambda s: list(s.encode())) == list(text.prompt.encode())
    with pytest.raises(RequestSetError, match="no tokenizer"):
        text.token_ids()


def test_require_split_refuses_dev_requests_in_a_sealed_final():
    requests = load_requests(PROJECT_SET)
    with pytest.raises(RequestSetError, match="only unseen"):
        require_split(requests, "unseen", "the sealed final")
    require_split([r for r in requests if r.split == "unseen"], "unseen", "the sealed final")


def test_outputs_file_round_trip_and_errors(tmp_path):
    outputs = [RequestOutput("a", (1, 2, 3), 0.0, (0.1, 0.2, 0.4)), RequestOutput("b", (4,))]
    path = write_outputs(tmp_path / "out" / "o.jsonl", outputs)
    loaded = load_outputs(path)
    assert list(loaded.values()) == outputs
    assert loaded["a"].rate == pytest.approx(3 / 0.4)
    with pytest.raises(RequestSetError, match="no timestamps"):
        _ = loaded["b"].rate
    path.write_text('{"id": "a", "output_ids": [1], "token_times": [0.1, 0.2]}\n')
    with pytest.raises(RequestSetError) as err:
        load_outputs(path)
    assert err.value.where == f"{path}:1"
