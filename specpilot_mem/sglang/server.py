"""Running SGLang's HTTP server from an export: the runtime check, the launch, health, a clean stop.

An export (``export.py``) is a complete ``sglang`` package; it is put first on ``PYTHONPATH`` over an
installed ``sglang==0.5.23``, whose dependencies are what the server needs. ``check_runtime`` says
clearly what is missing before anything starts. ``SGLangServer`` launches
``python -m sglang.launch_server`` in its own process group, waits for ``/health`` and stops it with
SIGTERM (SIGKILL after a grace period), so no worker processes outlive it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from specpilot_mem.errors import SpecPilotError

PINNED_VERSION = "0.5.23"
LAUNCH_MODULE = "sglang.launch_server"


class SGLangRuntimeError(SpecPilotError):
    """SGLang cannot run here: not installed, the wrong release, missing dependencies, a server that died."""


_RUNTIME_PROBE = r"""
import json, sys
from importlib import metadata
out = {"python": sys.version.split()[0], "sglang": None, "missing": []}
try:
    out["sglang"] = metadata.version("sglang")
except metadata.PackageNotFoundError:
    pass
if out["sglang"] is not None:
    try:
        from packaging.requirements import Requirement
    except ImportError:  # SGLang itself requires packaging
        out["missing"] = ["packaging"]
    else:
        for text in metadata.requires("sglang") or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                metadata.version(req.name)
            except metadata.PackageNotFoundError:
                out["missing"].append(req.name)
json.dump(out, sys.stdout)
"""


def check_runtime(python: str = sys.executable) -> dict:
    """Check that ``python`` has the pinned SGLang release and all its dependencies; return what it found."""
    done = subprocess.run([python, "-c", _RUNTIME_PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        raise SGLangRuntimeError(
            f"could not run {python}",
            where=python,
            fix=f"pass a working Python interpreter ({done.stderr.strip()[-300:]})",
        )
    found = json.loads(done.stdout)
    if found["sglang"] is None:
        raise SGLangRuntimeError(
            "SGLang is not installed",
            where=python,
            fix=f"on the GPU machine: `pip install sglang=={PINNED_VERSION}` (the export supplies the patched sources; "
            "the installed release supplies its dependencies)",
        )
    if found["sglang"] != PINNED_VERSION:
        raise SGLangRuntimeError(
            f"the installed SGLang is {found['sglang']}, not the pinned {PINNED_VERSION}",
            where=python,
            fix=f"`pip install sglang=={PINNED_VERSION}`: the entries were recorded against that release",
        )
    if found["missing"]:
        raise SGLangRuntimeError(
            f"SGLang's dependencies are missing: {', '.join(found['missing'])}",
            where=python,
            fix=f"`pip install sglang=={PINNED_VERSION}` with its dependencies (not --no-deps)",
        )
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_argv(python: str, server_args: Sequence[str], host: str, port: int) -> list[str]:
    return [python, "-m", LAUNCH_MODULE, *server_args, "--host", host, "--port", str(port)]


class SGLangServer:
    """One SGLang server process from an export; use as a context manager (``with SGLangServer(...) as s``)."""

    def __init__(
        self,
        export_dir: str | os.PathLike,
        server_args: Sequence[str],
        *,
        gpu: int | None = None,
        python: str = sys.executable,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_path: str | os.PathLike | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 900.0,
        stop_timeout: float = 30.0,
    ):
        self.export_dir = Path(export_dir).resolve()
        self.server_args = list(server_args)
        self.gpu = gpu
        self.python = python
        self.host = host
        self.port = port or free_port()
        self.log_path = Path(log_path) if log_path else None
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def environment(self) -> dict[str, str]:
        env = {**os.environ, **self.extra_env}
        env["PYTHONPATH"] = os.pathsep.join([str(self.export_dir), *filter(None, [env.get("PYTHONPATH")])])
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(self.gpu)
        return env

    def start(self) -> "SGLangServer":
        if self.process is not None:
            raise SGLangRuntimeError("this server is already running", where=self.url)
        # Without a log file the server writes to this process's terminal.
        self._log = open(self.log_path, "ab") if self.log_path else None
        self.process = subprocess.Popen(
            launch_argv(self.python, self.server_args, self.host, self.port),
            env=self.environment(),
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise SGLangRuntimeError(
                    f"the SGLang server exited with status {code} before it became healthy",
                    where=self.url,
                    fix=f"read its log{f' at {self.log_path}' if self.log_path else ' (pass a log path)'}",
                )
            if self.healthy():
                return
            time.sleep(0.5)
        self.stop()
        raise SGLangRuntimeError(
            f"the SGLang server did not answer /health within {self.startup_timeout:.0f} s",
            where=self.url,
            fix="check its log; large models need a longer startup timeout",
        )

    def stop(self) -> int | None:
        """SIGTERM to the server's process group, SIGKILL after the grace period; returns the exit status."""
        if self.process is None:
            return None
        code = self.process.poll()
        if code is None:
            self._signal(signal.SIGTERM)
            try:
                code = self.process.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                code = self.process.wait()
        # Workers the launcher spawned share its process group; none may outlive it.
        self._signal(signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None
        self.process = None
        return code

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "SGLangServer":
        self.start()
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
