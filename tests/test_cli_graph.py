"""The text graph is a right requirement tree; png needs a real --output."""

from __future__ import annotations

from specpilot_mem.commands.graph import to_tree
from specpilot_mem.main import main


def test_each_entry_is_drawn_under_every_entry_it_requires():
    order = ["options", "kernels", "head", "tree", "both"]
    requires = {
        "options": [],
        "kernels": [],
        "head": ["options"],
        "tree": ["options", "kernels"],
        "both": ["head", "tree"],
    }
    assert to_tree(order, requires) == [
        "stock",
        "├── options",
        "│   ├── head",
        "│   │   └── both",
        "│   └── tree",
        "│       └── both",
        "└── kernels",
        "    └── tree (see above)",
    ]


def test_text_graph_of_the_project(project_entries_home, capsys):
    assert main(["graph", "--home", str(project_entries_home.root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["stock", "└── options"] and all(line.startswith("    ") for line in lines[2:])


def test_png_without_output_writes_nothing(project_entries_home, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["graph", "--format", "png", "--home", str(project_entries_home.root)]) == 2
    assert "--format png needs --output FILE" in capsys.readouterr().err and list(tmp_path.iterdir()) == []
    assert (
        main(
            [
                "graph",
                "--format",
                "png",
                "--output",
                str(tmp_path / "no" / "g.png"),
                "--home",
                str(project_entries_home.root),
            ]
        )
        == 2
    )
    assert f"there is no folder {tmp_path / 'no'}" in capsys.readouterr().err and list(tmp_path.iterdir()) == []
