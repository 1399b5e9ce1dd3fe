"""The one header every benchmark result JSON starts with: what was measured, where, on which code.

``result_header(benchmark)`` gives the benchmark name, the UTC date, the command line, the git commit the
files came from and whether the tree was dirty, the device (GPU name, multiprocessors, clocks and power limit as
nvidia-smi reads them at the start; or the CPU), and the versions of Python, torch, Triton and CUDA.
``write_result(doc, path)`` writes a result atomically; ``print_result(doc, out)`` prints it and, given a path,
writes it there too (what every benchmark script ends with).

On the lent GPU machine the working tree travels without a usable git history, so the commit and dirty flag
are taken from ``SPECPILOT_GIT_COMMIT`` / ``SPECPILOT_GIT_DIRTY`` when set (the device harness sets them
from the checkout that sent the call); otherwise git is asked through :mod:`specpilot_mem.git`.

Imports only the standard library at module level (torch and triton lazily), so it loads on the bare
H200 and in the CPU tests alike.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git_state() -> dict:
    commit = os.environ.get("SPECPILOT_GIT_COMMIT")
    if commit:
        return {
            "commit": commit,
            "dirty": os.environ.get("SPECPILOT_GIT_DIRTY", "unknown") == "1",
            "source": "SPECPILOT_GIT_COMMIT",
        }
    try:
        from specpilot_mem.git import Repo

        repo = Repo(ROOT)
        return {"commit": repo.rev_parse("HEAD"), "dirty": repo.is_dirty(), "source": "git"}
    except Exception as exc:  # no git, or not a checkout: say so rather than guess
        return {"commit": None, "dirty": None, "source": f"unavailable ({type(exc).__name__})"}


def _versions() -> dict:
    out = {"python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["cuda"] = torch.version.cuda
    except ImportError:
        out["torch"] = None
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


CLOCK_FIELDS = ("clocks.sm", "clocks.max.sm", "clocks.mem", "power.limit", "temperature.gpu")


def _clocks() -> dict | None:
    """GPU 0's clocks (MHz), power limit (W) and temperature as nvidia-smi reads them now; None without it.
    The SM clock under load moves with the power cap, so the figures that depend on it log it per timing too."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        query = [smi, "-i", "0", f"--query-gpu={','.join(CLOCK_FIELDS)}", "--format=csv,noheader,nounits"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=10)
        values = [v.strip() for v in done.stdout.strip().split(",")]
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode or len(values) != len(CLOCK_FIELDS):
        return None
    return {
        name: (float(value) if value.replace(".", "", 1).isdigit() else value)
        for name, value in zip(CLOCK_FIELDS, values)
    }


def _device() -> dict:
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return {
                "kind": "cuda",
                "name": props.name,
                "sms": props.multi_processor_count,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"sm_{props.major}{props.minor}",
                "count": torch.cuda.device_count(),
                "clocks": _clocks(),
            }
    except ImportError:
        pass
    return {"kind": "cpu", "name": platform.processor() or platform.machine(), "cores": os.cpu_count()}


def result_header(benchmark: str, argv: list[str] | None = None) -> dict:
    """The shared header of a result document (a plain dict: add the figures beside it)."""
    argv = list(sys.argv if argv is None else argv)
    script = argv[0] if argv else ""
    try:
        script = str(Path(script).resolve().relative_to(ROOT))
    except ValueError:
        pass
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", script, *argv[1:]]) if script else None,
        "git": _git_state(),
        "device": _device(),
        "versions": _versions(),
    }


def write_result(doc: dict, path: str | os.PathLike) -> Path:
    """Write ``doc`` as indented JSON to ``path`` atomically (a temporary file beside it, then a rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def print_result(doc: dict, out: str | os.PathLike | None = None) -> None:
    """Print ``doc`` as indented JSON and, when ``out`` is given, write it there atomically too."""
    print(json.dumps(doc, indent=1))
    if out:
        write_result(doc, out)
