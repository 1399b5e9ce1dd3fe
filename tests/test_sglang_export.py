"""``export_tree``: an applied tree as a complete, importable ``sglang`` package.

The stock export must hold exactly the wheel's ``sglang/`` files (sources from the fork, compiled files
restored from the wheel, all matching RECORD). An export of applied entries must import from a fresh
virtual environment that holds only SGLang's import dependencies as ``scripts/install.sh`` lists
them (and their own requirements), nothing else from this machine.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from specpilot_mem.errors import ForkError, SpecPilotError
from specpilot_mem.sglang.cpu_import import write_torchvision_standin
from specpilot_mem.sglang.entry_src import sglang_entry_ids
from specpilot_mem.sglang.export import MANIFEST, export_tree, read_manifest
from specpilot_mem.store.resolver import apply_entries
from specpilot_mem.store.stock import fetch_wheel

pytestmark = pytest.mark.sglang
PROJECT = Path(__file__).resolve().parents[1]
# What the project itself installs before SGLang's import line (scripts/install.sh, first two lines).
PROJECT_DEPENDENCIES = ("torch", "numpy", "pydantic", "triton", "safetensors", "pyyaml")


@pytest.fixture(scope="module")
def stock_export(stock_fork_home, tmp_path_factory):
    dest = tmp_path_factory.mktemp("exports") / "stock"
    manifest = export_tree(stock_fork_home, "stock", dest, [])
    return dest, manifest


def wheel_package_files() -> dict[str, str]:
    with zipfile.ZipFile(fetch_wheel()) as wheel:
        record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(wheel.read(record).decode()))
        return {
            path: base64.urlsafe_b64decode(digest.split("=", 1)[1] + "==").hex()
            for path, digest, _ in rows
            if path.startswith("sglang/") and digest
        }


def test_stock_export_is_the_wheels_package(stock_export):
    dest, manifest = stock_export
    expected = wheel_package_files()
    found = {p.relative_to(dest).as_posix(): p for p in dest.rglob("*") if p.is_file()}
    assert set(found) - set(expected) == {MANIFEST}
    assert set(expected) - set(found) == set()
    for path, digest in expected.items():
        assert hashlib.sha256(found[path].read_bytes()).hexdigest() == digest, path
    assert set(manifest["compiled_files"]) == {p for p in expected if p.endswith(".so")}
    assert manifest["source_files"] + len(manifest["compiled_files"]) == len(expected)
    assert read_manifest(dest) == manifest and manifest["entries"] == [] and manifest["options"] == {}


def test_export_keeps_executable_bits(stock_export):
    dest, _ = stock_export
    with zipfile.ZipFile(fetch_wheel()) as wheel:
        executables = [
            i.filename for i in wheel.infolist() if i.filename.startswith("sglang/") and (i.external_attr >> 16) & 0o111
        ]
    assert executables
    assert all((dest / name).stat().st_mode & 0o111 for name in executables)


def test_export_refuses_a_folder_that_is_not_an_export(stock_fork_home, tmp_path):
    dest = tmp_path / "mine"
    dest.mkdir()
    (dest / "notes.txt").write_text("keep me")
    with pytest.raises(SpecPilotError, match="not an earlier SpecPilot export"):
        export_tree(stock_fork_home, "stock", dest, [])
    assert [p.name for p in dest.iterdir()] == ["notes.txt"]


def test_export_of_an_unknown_revision_writes_nothing(stock_fork_home, tmp_path):
    with pytest.raises(ForkError, match="not a tree, commit or branch"):
        export_tree(stock_fork_home, "no-such-branch", tmp_path / "out", [])
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []


def test_reexport_replaces_an_earlier_export(project_entries_home, stock_export, tmp_path):
    dest = tmp_path / "export"
    shutil.copytree(stock_export[0], dest, symlinks=True)  # an earlier export
    (dest / "sglang" / "stale.py").write_text("")
    manifest = apply_entries(project_entries_home, ["options"], export=str(dest)).export
    assert not (dest / "sglang" / "stale.py").exists()
    assert (dest / "sglang" / "srt" / "specpilot" / "__init__.py").is_file()
    assert [e["id"] for e in manifest["entries"]] == ["options"]
    assert read_manifest(dest)["tree"] == manifest["tree"] != stock_export[1]["tree"]


def import_closure() -> list[metadata.Distribution]:
    """The distributions SGLang's import needs: install.sh's SGLang lines, the project's base, their requirements."""
    script = (PROJECT / "scripts" / "install.sh").read_text()
    sglang_lines = script[script.index("SGLang 0.5.23's pure-Python import dependencies") :]
    roots = re.findall(r'"([A-Za-z0-9_.-]+)==', sglang_lines) + list(PROJECT_DEPENDENCIES)
    seen: dict[str, metadata.Distribution] = {}
    stack = list(roots)
    while stack:
        name = stack.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = metadata.distribution(name)
        seen[key] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                stack.append(req.name)
    return list(seen.values())


def fresh_venv(root: Path) -> Path:
    """A venv without this machine's site-packages; only the import closure is linked into it."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    links = root / "links"
    links.mkdir()
    for dist in import_closure():
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            source = Path(dist.locate_file(top))
            target = links / top
            if source.exists() and not target.exists() and top != "__pycache__":
                target.symlink_to(source)
    (site / "import-closure.pth").write_text(str(links) + "\n")
    return python


IMPORT_CHECK = """
import json, sys
import sglang
import sglang.srt.server_args as server_args
import sglang.srt.layers.quantization as quantization
from sglang.srt.specpilot import discover
found = {"sglang": sglang.__file__, "server_args": server_args.__file__, "entries": sorted(discover()),
         "w12": "w12" in quantization.QUANTIZATION_METHODS, "path": sys.path}
if "w12" in found["entries"]:
    import sglang.srt.specpilot.w12_method as w12_method
    found["w12_method"] = w12_method.__file__
print(json.dumps(found))
"""


def test_applied_export_imports_in_a_fresh_venv(project_entries_home, sglang_entries_export, tmp_path):
    export, order = sglang_entries_export
    python = fresh_venv(tmp_path)
    standin = write_torchvision_standin(tmp_path / "standin")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": f"{export}:{standin}",
        "CUDA_VISIBLE_DEVICES": "",
        "TRITON_INTERPRET": "1",
    }
    done = subprocess.run([python, "-c", IMPORT_CHECK], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["sglang"].startswith(str(export))
    assert found["server_args"].startswith(str(export))
    # options declares no entry module of its own; every other SGLang entry does
    assert set(found["entries"]) == set(sglang_entry_ids(project_entries_home)) - {"options"}
    assert not any("site-packages" in p and str(tmp_path) not in p for p in found["path"])
    if "w12" in order:
        assert found["w12"] and found["w12_method"].startswith(str(export))
