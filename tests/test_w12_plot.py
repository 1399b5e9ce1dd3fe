"""The W12 speedup figure, drawn from committed H200 results (CPU only)."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("w12_plot", ROOT / "scripts" / "w12_plot.py")  # a script, not a package
w12_plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(w12_plot)
PlotInputError, main, read_speedups = w12_plot.PlotInputError, w12_plot.main, w12_plot.read_speedups

ARCHIVE = ROOT / "benchmarks" / "archive" / "results"  # older runs, kept by name
V11 = ARCHIVE / "w12-gemm-mma-v11-h200x2-2026-11-30.json"
V12 = ARCHIVE / "w12-gemm-mma-v12-h200-2026-11-30.json"
V20 = ARCHIVE / "w12-gemm-mma-v20-final-h200-2026-12-01.json"


def test_speedups_are_read_per_shape_and_row_count():
    speedups = read_speedups(V12, "mma")
    assert set(speedups) == {"qkv", "o_proj", "gate_up", "down", "lm_head"}
    assert [m for m, _ in speedups["qkv"]] == [1, 2, 4, 8, 16, 32, 48, 64]
    assert all(s > 0 for points in speedups.values() for _, s in points)


def test_figure_compares_two_runs(tmp_path):
    out = tmp_path / "figs" / "w12.png"
    assert main([str(V11), str(V12), "--label", "v11", "--label", "v12", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    # the picture says what drew it and from which results (their names and the commits they measured)
    from PIL import Image

    provenance = json.loads(Image.open(out).text["Description"])
    assert provenance["benchmark"] == "w12_plot" and len(provenance["git"]["commit"]) == 40
    assert [Path(s["file"]).name for s in provenance["inputs"]] == [V11.name, V12.name]
    assert provenance["inputs"][0]["variant"] == "mma" and provenance["inputs"][0]["label"] == "v11"


def test_bad_input_is_named_and_writes_nothing(tmp_path, capsys):
    not_bench = tmp_path / "other.json"
    not_bench.write_text('{"cases": []}')
    out = tmp_path / "w12.png"
    assert main([str(V12), str(not_bench), "--out", str(out)]) == 2
    assert "no 'shapes' section" in capsys.readouterr().err and not out.exists()
    with pytest.raises(PlotInputError, match="try --variant triton"):
        read_speedups(V12, "triton")
    with pytest.raises(SystemExit):  # one label for two files
        main([str(V11), str(V12), "--label", "only", "--out", str(out)])
    with pytest.raises(SystemExit):  # three variants for two files
        main([str(V11), str(V12), "--variant", "mma", "--variant", "mma", "--variant", "mma", "--out", str(out)])
    with pytest.raises(PlotInputError, match="without --settle"):
        read_speedups(V12, "mma_settled")
    assert not out.exists()


def test_one_file_twice_shows_burst_and_settled_figures(tmp_path):
    # the v20 runs timed 1, 16, 32 and 64 rows again once the power cap had settled the SM clock (--settle)
    settled = read_speedups(V20, "mma_settled")
    assert [m for m, _ in settled["lm_head"]] == [1, 16, 32, 64]
    out = tmp_path / "w12.png"
    assert (
        main(
            [
                str(V20),
                str(V20),
                "--variant",
                "mma",
                "--variant",
                "mma_settled",
                "--label",
                "burst",
                "--label",
                "settled",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
