"""Optional dependencies stay out of start-up, and a missing one is an error that names its extra."""

import json
import subprocess
import sys

import pytest

from specpilot_mem.optional import MissingExtraError, optional_import, pyplot

LOADED = (
    "import json, sys\nimport specpilot_mem.main as main\nmain.build_parser()\n"
    "print(json.dumps(sorted(m for m in ('anthropic', 'matplotlib', 'torch', 'triton') if m in sys.modules)))"
)


def test_building_every_verbs_parser_imports_no_optional_or_heavy_package():
    done = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_a_missing_optional_package_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "anthropic", None)  # what `import anthropic` meets when it is not installed
    with pytest.raises(MissingExtraError) as err:
        optional_import("anthropic", "agent backend 'anthropic'")
    assert err.value.fix == "pip install 'specpilot[agents]'" and err.value.where == "agent backend 'anthropic'"
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match="graph --png needs matplotlib") as err:
        pyplot("graph --png")
    assert err.value.fix == "pip install 'specpilot[plot]'"


def test_a_figure_without_matplotlib_fails_before_writing_anything(tmp_path, monkeypatch):
    from specpilot_mem.forcing.plot import plot_figure4

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match="Figure 4"):
        plot_figure4([], tmp_path / "f.png")
    assert not (tmp_path / "f.png").exists()
