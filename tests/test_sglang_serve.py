"""``specpilot-mem serve``: the export, the runtime check, the option check and the launch command.

The runtime check reads the installed SGLang's metadata from the interpreter it is given; here that
interpreter is a virtual environment (with this machine's packages) holding an ``sglang``
distribution record of a chosen version and requirements, since SGLang's runtime cannot be installed
on this machine. Launching and stopping the server itself is covered in ``test_sglang_adapter.py``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot_mem.main import main
from specpilot_mem.models import DeploymentRecord
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.records import dump_record
from specpilot_mem.store.resolver import apply_entries

pytestmark = pytest.mark.sglang


def make_deployment(home, name: str, entries: list[str], tuned: dict | None = None) -> None:
    fork = open_fork(home)
    result = apply_entries(home, entries, branch=f"deploy/{name}", force=True)
    record = DeploymentRecord(
        name=name,
        gpu="H200",
        arch="sm_90",
        model="Qwen3.8-27B",
        drafter="DFlash2",
        regime="single",
        entries=entries,
        base=fork.stock_commit,
        branch=f"deploy/{name}",
        tree=result.tree,
        created=dt.date(2026, 1, 1),
    )
    folder = home.rounds / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "deployment.yaml").write_text(dump_record(record))
    if tuned is not None:
        (folder / "options.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in tuned.items()))


@pytest.fixture(scope="module")
def python_with_sglang(tmp_path_factory):
    """Interpreters whose installed ``sglang`` distribution is (version, requirements) as named."""
    made: dict[tuple, str] = {}

    def make(version: str, requires: tuple[str, ...] = ("numpy", "pydantic")) -> str:
        key = (version, requires)
        if key not in made:
            venv = tmp_path_factory.mktemp("venv")
            subprocess.run(
                [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True
            )
            python = venv / "bin" / "python"
            site = subprocess.run(
                [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            info = Path(site) / f"sglang-{version}.dist-info"
            info.mkdir(parents=True)
            lines = ["Metadata-Version: 2.1", "Name: sglang", f"Version: {version}"]
            lines += [f"Requires-Dist: {r}" for r in requires] + ['Requires-Dist: torchvision; extra == "vision"']
            (info / "METADATA").write_text("\n".join(lines) + "\n")
            made[key] = str(python)
        return made[key]

    return make


def serve(home, *args: str) -> tuple[int, dict]:
    """Run ``specpilot-mem serve --json ARGS`` in-process; (exit code, its JSON output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["serve", "--home", str(home.root), "--json", *args])
    return code, json.loads(out.getvalue())


def test_dry_run_exports_and_puts_tuned_options_before_the_users(
    project_entries_home, sglang_entries_export, python_with_sglang
):
    home = project_entries_home
    export, ids = sglang_entries_export  # the same tree, so serve finds its export cached
    tuned = {"--specpilot-w12-lm-head": True} if "w12" in ids else {}
    make_deployment(home, "serve-demo", ids, tuned)
    python = python_with_sglang("0.5.23")
    code, payload = serve(
        home,
        "serve-demo",
        "--gpu",
        "2",
        "--python",
        python,
        "--dry-run",
        "--",
        "--model-path",
        "/models/target",
        "--dtype",
        "bfloat16",
    )
    assert code == 0, payload
    assert Path(payload["export"]) == export
    manifest = json.loads((export / "specpilot-export.json").read_text())
    assert payload["tree"] == manifest["tree"] == open_fork(home).repo.rev_parse("deploy/serve-demo^{tree}")
    assert payload["entries"] == [e["id"] for e in manifest["entries"]] and "options" in payload["entries"]
    assert payload["sglang"] == "0.5.23" and payload["gpu"] == 2
    assert payload["command"] == [
        python,
        "-m",
        "sglang.launch_server",
        *(["--specpilot-w12-lm-head"] if tuned else []),
        "--model-path",
        "/models/target",
        "--dtype",
        "bfloat16",
        "--host",
        "127.0.0.1",
        "--port",
        "30000",
    ]
    assert (export / "sglang" / "srt" / "server_args.py").is_file()


def test_option_of_an_entry_not_applied_is_refused(project_entries_home, python_with_sglang):
    home = project_entries_home
    make_deployment(home, "serve-options-only", ["options"])
    code, error = serve(
        home,
        "serve-options-only",
        "--python",
        python_with_sglang("0.5.23"),
        "--dry-run",
        "--",
        "--specpilot-w12-lm-head",
        "--specpilot-no-such-flag=1",
    )
    assert code == 2
    assert "--specpilot-no-such-flag (no entry declares it)" in error["what"]
    if (home.entries / "w12" / "entry.yaml").is_file():
        assert "--specpilot-w12-lm-head (entry w12)" in error["what"]
    assert "applied: options" in error["where"]


def test_wrong_installed_sglang_is_refused(project_entries_home, python_with_sglang):
    make_deployment(project_entries_home, "serve-options-only", ["options"])
    code, error = serve(
        project_entries_home, "serve-options-only", "--python", python_with_sglang("0.5.22"), "--dry-run"
    )
    assert code == 2 and "0.5.22, not the pinned 0.5.23" in error["what"]


def test_missing_dependencies_are_named(project_entries_home, python_with_sglang):
    make_deployment(project_entries_home, "serve-options-only", ["options"])
    python = python_with_sglang("0.5.23", ("numpy", "sglang-dependency-that-is-not-installed>=1"))
    code, error = serve(project_entries_home, "serve-options-only", "--python", python, "--dry-run")
    assert code == 2
    assert error["what"] == "SGLang's dependencies are missing: sglang-dependency-that-is-not-installed"


def test_sglang_not_installed(project_entries_home):
    make_deployment(project_entries_home, "serve-options-only", ["options"])
    code, error = serve(project_entries_home, "serve-options-only", "--python", sys.executable, "--dry-run")
    assert code == 2 and error["what"] == "SGLang is not installed"


def test_unknown_deployment(project_entries_home):
    code, error = serve(project_entries_home, "no-such-deployment", "--dry-run")
    assert code == 2 and "no deployment 'no-such-deployment'" in error["what"]


def test_malformed_tuned_options(project_entries_home, python_with_sglang):
    make_deployment(project_entries_home, "serve-bad-options", ["options"])
    (project_entries_home.rounds / "serve-bad-options" / "options.yaml").write_text("- not a mapping\n")
    code, error = serve(
        project_entries_home, "serve-bad-options", "--python", python_with_sglang("0.5.23"), "--dry-run"
    )
    assert code == 2 and "map flags to values" in error["what"]


HEALTH_ONLY_SERVER = """
import argparse, json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
args, rest = parser.parse_known_args()
with open(os.environ["STANDIN_LOG"], "w") as log:
    json.dump({"pid": os.getpid(), "argv": rest, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}, log)
ThreadingHTTPServer((args.host, args.port), Health).serve_forever()
"""


def test_serve_runs_until_sigterm_then_stops_the_server(
    project_entries_home, python_with_sglang, tmp_path, monkeypatch
):
    """The run loop end to end. SGLang's server cannot run here, so the deployment's export is replaced
    by a package whose ``sglang.launch_server`` only answers /health; everything else is production."""
    import os
    import signal
    import threading
    import time
    import urllib.request

    from specpilot_mem.commands import serve as serve_command
    from specpilot_mem.sglang.server import free_port

    export = tmp_path / "export"
    (export / "sglang").mkdir(parents=True)
    (export / "sglang" / "__init__.py").write_text("")
    (export / "sglang" / "launch_server.py").write_text(HEALTH_ONLY_SERVER)
    manifest = {"tree": "0" * 40, "entries": [], "options": {}}
    monkeypatch.setattr(serve_command, "deployment_export", lambda home, name, show_progress: (export, manifest))
    monkeypatch.setenv("STANDIN_LOG", str(tmp_path / "standin.json"))
    make_deployment(project_entries_home, "serve-options-only", ["options"])
    port = free_port()

    def stop_when_healthy() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    stopper = threading.Thread(target=stop_when_healthy)
    stopper.start()
    code, payload = serve(
        project_entries_home,
        "serve-options-only",
        "--gpu",
        "1",
        "--port",
        str(port),
        "--python",
        python_with_sglang("0.5.23"),
        "--",
        "--model-path",
        "/models/target",
    )
    stopper.join()
    assert code == 0 and payload["url"] == f"http://127.0.0.1:{port}"
    launched = json.loads((tmp_path / "standin.json").read_text())
    assert launched["argv"] == ["--model-path", "/models/target"] and launched["cuda"] == "1"
    with pytest.raises(ProcessLookupError):
        os.kill(launched["pid"], 0)
    assert signal.getsignal(signal.SIGTERM) is before
