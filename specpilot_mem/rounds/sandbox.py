"""Running agents' commands as an unprivileged user that sees only its worktree.

Where the machine allows it (root, ``useradd``, ``unshare``, ``setpriv``), every command an agent
runs, and every system the controller times, executes as the system user ``specpilot-agent`` in a
private mount namespace whose hidden paths (the round records, which hold the unseen split and the
measurements, the request sets, the agents' worktrees) are covered by empty tmpfs mounts, with a
private, empty ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (nothing written there outlives the command),
and in a PID namespace of its own: when the command ends, every process it started ends with it, so
nothing outlives an agent's turn. Its worktree is the only place it owns. Elsewhere commands run as
the current user in a process group that is killed when they end, and the round records say
``isolation: none``.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from specpilot_mem.errors import RoundError

AGENT_USER = "specpilot-agent"
# World-writable scratch that a command would otherwise share with later turns and runs.
PRIVATE_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
# Variables an agent's shell never sees: credentials of the runner and of the agent backends.
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")


def scrubbed_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items() if not any(marker in k.upper() for marker in SECRET_MARKERS)}


def secret_values(env: Mapping[str, str] | None = None) -> list[str]:
    """Values that must never reach a transcript (long enough to be a credential)."""
    env = os.environ if env is None else env
    return [v for k, v in env.items() if any(m in k.upper() for m in SECRET_MARKERS) and len(v) >= 8]


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "[redacted]")
    return text


@dataclass
class Sandbox:
    """How agents' commands run: as ``user`` with ``hidden`` paths masked, or unconfined when user is None."""

    user: str | None
    hidden: list[Path] = field(default_factory=list)

    @property
    def isolation(self) -> str:
        return f"user {self.user}, private mounts, own PID namespace" if self.user else "none"

    def to_dict(self) -> dict:
        return {"user": self.user, "hidden": [str(p) for p in self.hidden]}

    @classmethod
    def from_dict(cls, data: dict | None) -> "Sandbox":
        data = data or {}
        return cls(data.get("user"), [Path(p) for p in data.get("hidden", [])])

    @classmethod
    def for_machine(cls, hidden: Iterable[Path], *, create_user: bool = True) -> "Sandbox":
        """The strongest isolation this machine allows."""
        tools = all(shutil.which(t) for t in ("setpriv", "unshare", "mount"))
        if os.geteuid() != 0 or not tools:
            return cls(None)
        try:
            pwd.getpwnam(AGENT_USER)
        except KeyError:
            if not create_user or not shutil.which("useradd"):
                return cls(None)
            proc = subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", AGENT_USER],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0 and "already exists" not in proc.stderr:
                return cls(None)
        return cls(AGENT_USER, [Path(p).resolve() for p in hidden])

    def give(self, path: Path) -> None:
        """Make the agent user own ``path`` and everything below it (its worktree, files written for it)."""
        if self.user:
            entry = pwd.getpwnam(self.user)
            _chown_tree(path, entry.pw_uid, entry.pw_gid)

    def take_back(self, path: Path) -> None:
        """Return a worktree to the runner before the controller reads it."""
        if self.user:
            _chown_tree(path, os.geteuid(), os.getegid())

    def command(self, command: str, cwd: Path, expose: Iterable[Path] = ()) -> list[str]:
        """The argv that runs ``command`` in ``cwd`` confined; ``expose`` names folders it must reach
        (an interpreter under the runner's home) although a folder above them is closed to others."""
        if not self.user:
            return ["bash", "-c", command]
        entry = pwd.getpwnam(self.user)
        cwd = Path(cwd).resolve()
        mounts = _exposing(expose)
        mounts += [
            f"mount -t tmpfs -o size=1m,mode=000 specpilot-hidden {shlex.quote(str(p))}"
            for p in self.hidden
            if p.exists() and p != cwd and p not in cwd.parents
        ]
        # a scratch folder that holds the working folder itself stays (homes kept under /tmp)
        mounts += [
            f"mount -t tmpfs -o mode=1777 specpilot-scratch {folder}"
            for folder in PRIVATE_SCRATCH
            if os.path.isdir(folder) and Path(folder) not in cwd.parents
        ]
        drop = (
            f"exec setpriv --reuid={entry.pw_uid} --regid={entry.pw_gid} --clear-groups "
            f"--inh-caps=-all --no-new-privs -- bash -c {shlex.quote(command)}"
        )
        inner = " && ".join([*mounts, f"cd {shlex.quote(str(cwd))}", drop])
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "--",
            "bash",
            "-c",
            inner,
        ]

    def run(self, command: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess:
        """Run an agent's shell command in its worktree; a time-out kills it and says so. Whatever it
        started in the background ends with it (its PID namespace, or else its process group)."""
        env = scrubbed_environment()
        env["HOME"] = str(cwd)
        # files, not pipes: a background process holding a pipe open must not keep the turn alive
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                self.command(command, cwd),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                code = 124
            finally:
                _kill_group(proc.pid)
                proc.wait()
            out.seek(0)
            err.seek(0)
            stdout, stderr = (handle.read().decode(errors="replace") for handle in (out, err))
        if code == 124:
            stderr = f"timed out after {timeout_s:.0f} s"
        return subprocess.CompletedProcess(proc.args, code, stdout, stderr)


def _exposing(paths: Iterable[Path]) -> list[str]:
    """Mounts that make ``paths`` reachable for the agent user: the topmost folder above each that
    others cannot enter (e.g. /root) is covered by an empty tmpfs that they can, holding only the
    paths bound back in, so nothing else of it is visible either."""
    covered: dict[Path, list[Path]] = {}
    for path in dict.fromkeys(Path(p).resolve() for p in paths):
        closed = next((a for a in reversed(path.parents) if a != Path("/") and not os.stat(a).st_mode & 0o001), None)
        if closed is not None and path.exists():
            covered.setdefault(closed, []).append(path)
    if not covered:
        return []
    stage = next((d for d in ("/mnt", "/media", "/srv") if os.path.isdir(d)), None)
    if stage is None:
        raise RoundError(
            "the sandbox needs an empty mount point (/mnt, /media or /srv) to stage folders on",
            where="sandbox",
            fix="create /mnt",
        )
    staged = [path for paths_below in covered.values() for path in paths_below]
    mounts = [f"mount -t tmpfs -o mode=755 specpilot-stage {stage}"]
    for index, path in enumerate(staged):
        mounts += [f"mkdir -p {stage}/{index}", f"mount --rbind {shlex.quote(str(path))} {stage}/{index}"]
    mounts += [f"mount -t tmpfs -o mode=755 specpilot-exposed {shlex.quote(str(folder))}" for folder in covered]
    for index, path in enumerate(staged):
        mounts += [f"mkdir -p {shlex.quote(str(path))}", f"mount --rbind {stage}/{index} {shlex.quote(str(path))}"]
    return mounts


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                os.lchown(os.path.join(root, name), uid, gid)


def confine(root: Path, relative: str) -> Path:
    """``relative`` resolved inside ``root``; anything that escapes it (``..``, absolute, symlinks) is refused."""
    root = root.resolve()
    path = (root / relative).resolve()
    if path != root and root not in path.parents:
        raise RoundError(
            f"path {relative!r} is outside the worktree",
            where=str(root),
            fix="agents may only read and write inside their own worktree",
        )
    return path
