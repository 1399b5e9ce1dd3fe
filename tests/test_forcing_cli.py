"""``specpilot-mem tf`` end to end: files in, verdicts (--json) and Figure 4 out."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_forcing_support import PlantedScorer, make_case, other_token

from specpilot_mem.controller.system import RequestOutput, load_outputs, write_outputs
from specpilot_mem.forcing.plot import plot_figure4
from specpilot_mem.forcing.verdict import Verdict
from specpilot_mem.main import main


def scorer_from_file(path: str) -> PlantedScorer:
    """Scorer factory the CLI loads with --scorer test_forcing_cli:scorer_from_file --scorer-arg path=..."""
    data = json.loads(open(path, encoding="utf-8").read())
    scorer = PlantedScorer({tuple(row["prompt"]): row["reference"] for row in data["requests"]})
    for prompt, position, token, gap in data["ties"]:
        scorer.tie(tuple(prompt), position, token, gap)
    return scorer


@pytest.fixture()
def files(tmp_path):
    reqs, reference, _ = make_case(requests=80, length=200, seed=21)
    rng = np.random.default_rng(22)
    ties, outputs = [], {"ar": [], "stock": [], "lossless": [], "faulty": []}
    for request in reqs:
        prompt, ref = request.prompt_ids, reference[request.prompt_ids]
        outputs["ar"].append(list(ref))
        for name, tie_rate, events in (("stock", 0.007, 0), ("lossless", 0.007, 0), ("faulty", 0.03, 1)):
            sequence = list(ref)
            positions = rng.choice(len(ref), size=rng.binomial(len(ref), tie_rate) + events, replace=False)
            for k, position in enumerate(int(p) for p in positions):
                if k < len(positions) - events:
                    ties.append([list(prompt), position, other_token(ref[position], 5), 0.1])
                    sequence[position] = other_token(ref[position], 5)
                else:
                    sequence[position] = other_token(ref[position], 3)
            outputs[name].append(sequence)
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in reqs))
    (tmp_path / "scorer.json").write_text(
        json.dumps(
            {
                "requests": [{"prompt": list(r.prompt_ids), "reference": reference[r.prompt_ids]} for r in reqs],
                "ties": ties,
            }
        )
    )
    for name, sequences in outputs.items():
        write_outputs(tmp_path / f"{name}.jsonl", [RequestOutput(r.id, tuple(s)) for r, s in zip(reqs, sequences)])
    return tmp_path


def _args(d, *extra):
    return [
        "tf",
        "--requests",
        str(d / "requests.jsonl"),
        "--stock",
        str(d / "stock.jsonl"),
        "--system",
        f"lossless={d / 'lossless.jsonl'}",
        "--system",
        f"faulty={d / 'faulty.jsonl'}",
        "--scorer",
        "test_forcing_cli:scorer_from_file",
        "--scorer-arg",
        f"path={d / 'scorer.json'}",
        *extra,
    ]


def test_tf_json_accepts_lossless_rejects_faulty_and_plots(files, capsys):
    plot = files / "fig4.png"
    code = main(_args(files, "--ar", str(files / "ar.jsonl"), "--json", "--synthetic", "--plot", str(plot)))
    payload = json.loads(capsys.readouterr().out)
    assert code == 1  # a rejected system makes the command fail, for scripts
    verdicts = {v["system"]: v for v in payload["verdicts"]}
    assert verdicts["lossless"]["verdict"] == "accept"
    assert verdicts["faulty"]["verdict"] == "reject"
    assert verdicts["faulty"]["events"]["unexplained"] == 80
    assert payload["delta"] == 0.125 and payload["calibration"]["largest_gap"] == pytest.approx(0.1, abs=1e-5)
    assert payload["synthetic"] and all(v["synthetic"] for v in payload["verdicts"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tf_table_output_with_a_given_delta(files, capsys):
    code = main(_args(files, "--delta", "0.25"))
    out = capsys.readouterr().out
    assert code == 1
    assert "REJECT" in out and "ACCEPT" in out and "event rule" in out


def test_tf_bad_scorer_is_a_clear_error(files, capsys):
    args = _args(files, "--delta", "0.25", "--json")
    args[args.index("test_forcing_cli:scorer_from_file")] = "no_such_module:load"
    assert main(args) == 2
    error = json.loads(capsys.readouterr().out)
    assert error["error"] == "ForcingError" and error["where"] == "--scorer"


def test_tf_missing_outputs_name_the_request(files, capsys):
    lines = (files / "faulty.jsonl").read_text().splitlines()
    (files / "faulty.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    assert main(_args(files, "--delta", "0.25", "--json")) == 2
    assert "have no output" in json.loads(capsys.readouterr().out)["what"]


def test_figure4_groups_systems_under_their_stock(files, tmp_path, capsys):
    main(_args(files, "--delta", "0.25", "--json"))
    verdicts = [Verdict.from_dict(v) for v in json.loads(capsys.readouterr().out)["verdicts"]]
    path = plot_figure4(verdicts, tmp_path / "out" / "figure4.png", title="planted")
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert not list((tmp_path / "out").glob(".*"))  # the temporary file was renamed into place


def test_tf_stock_paths_explain_events_stock_made_on_another_run(files, capsys):
    """The faulty system's events, also present in a second stock run's outputs, are explained."""
    write_outputs(files / "stock-run2.jsonl", load_outputs(files / "faulty.jsonl").values())
    code = main(_args(files, "--delta", "0.25", "--json", "--stock-path", str(files / "stock-run2.jsonl")))
    faulty = {v["system"]: v for v in json.loads(capsys.readouterr().out)["verdicts"]}["faulty"]
    assert code == 1  # the rate rule still rejects: 3% mismatches against stock's 0.7%
    assert faulty["explained_by"]["stock-path"] == faulty["events"]["audited"] == 80
    assert not faulty["events"]["reject"] and faulty["rate"]["reject"]


def test_tf_long_outputs_needs_outputs_of_the_long_pass(files, capsys):
    """With --long-outputs every output must run to 4,096 tokens (or the scorer's context): a stock run of
    200-token outputs is refused as the reference, and a system's short outputs fail the length rule."""
    assert main(_args(files, "--delta", "0.25", "--json", "--long-outputs")) == 2
    error = json.loads(capsys.readouterr().out)
    assert error["where"] == "stock outputs" and "stop short" in error["what"]


def test_tf_prints_delta_its_basis_and_the_sample_that_would_suffice(files, capsys):
    """On 8 requests a lossless system cannot be told from a lossy one: the table output says inconclusive
    (exit 3), where δ came from, and what sample would suffice."""
    lines = (files / "requests.jsonl").read_text().splitlines()
    (files / "requests.jsonl").write_text("\n".join(lines[:8]) + "\n")
    args = _args(files, "--ar", str(files / "ar.jsonl"))
    del args[args.index(f"faulty={files / 'faulty.jsonl'}") - 1 : args.index(f"faulty={files / 'faulty.jsonl'}") + 1]
    code = main(args)
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3
    assert "INCONCLUSIVE" in out and "δ = 0.125 nats (largest gap" in out
    assert "would suffice" in out and "requests (" in out
