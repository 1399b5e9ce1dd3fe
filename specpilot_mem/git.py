"""The one module that talks to git.

Everything runs the git CLI with a fixed, machine-independent configuration (no system or user
config, no signing, no autocrlf, no hooks), so the same inputs give the same object ids everywhere.
Tree and commit objects the resolver builds in memory are written as loose objects here, which is
much faster than one ``git mktree`` process per directory.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import zlib
from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from specpilot_mem.errors import ForkError, SpecPilotError

# Identity and dates for every commit the tool makes: ids must not depend on who runs it.
IDENTITY_NAME = "SpecPilot"
IDENTITY_EMAIL = "specpilot@localhost"
ZERO_OID = "0" * 40

_ENV_CLEAN = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "LC_ALL": "C",
    "GIT_AUTHOR_NAME": IDENTITY_NAME,
    "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL,
    "GIT_COMMITTER_NAME": IDENTITY_NAME,
    "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
}
_CONFIG = (
    "-c",
    "core.autocrlf=false",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "core.quotepath=false",
    "-c",
    "advice.detachedHead=false",
)


class GitError(SpecPilotError):
    """A git command that failed unexpectedly (the store's own checks come first)."""


def _environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(_ENV_CLEAN)
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Iterable[str],
    cwd: str | os.PathLike,
    *,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    argv = ["git", *_CONFIG, *args]
    proc = subprocess.run(argv, cwd=cwd, input=input, capture_output=True, env=_environment(env))
    if check and proc.returncode != 0:
        raise GitError(
            f"git {' '.join(list(args)[:3])} failed: {proc.stderr.decode(errors='replace').strip()}",
            where=str(cwd),
        )
    return proc


def object_id(kind: str, content: bytes) -> str:
    """The git object id of ``content`` as an object of ``kind`` (blob, tree, commit)."""
    return hashlib.sha1(b"%s %d\0" % (kind.encode(), len(content)) + content).hexdigest()


def tree_content(entries: Mapping[str, tuple[str, str]]) -> bytes:
    """Serialized tree object from {name: (mode, oid)}; git sorts subtrees as if named ``name/``."""

    def sort_key(item):
        name, (mode, _) = item
        return name + "/" if mode == "40000" else name

    return b"".join(
        b"%s %s\0" % (mode.encode(), name.encode()) + bytes.fromhex(oid)
        for name, (mode, oid) in sorted(entries.items(), key=sort_key)
    )


def parse_tree_content(content: bytes) -> dict[str, tuple[str, str]]:
    entries: dict[str, tuple[str, str]] = {}
    pos = 0
    while pos < len(content):
        space = content.index(b" ", pos)
        nul = content.index(b"\0", space)
        mode = content[pos:space].decode()
        name = content[space + 1 : nul].decode()
        entries[name] = (mode, content[nul + 1 : nul + 21].hex())
        pos = nul + 21
    return entries


@dataclass(frozen=True)
class Signature:
    timestamp: int
    tz: str = "+0000"

    def line(self) -> str:
        return f"{IDENTITY_NAME} <{IDENTITY_EMAIL}> {self.timestamp} {self.tz}"


def commit_content(tree: str, parents: Iterable[str], message: str, when: Signature) -> bytes:
    lines = [
        f"tree {tree}",
        *(f"parent {p}" for p in parents),
        f"author {when.line()}",
        f"committer {when.line()}",
        "",
        message.rstrip("\n"),
        "",
    ]
    return "\n".join(lines).encode()


class Repo:
    """A git repository (the fork, or the project for its gitlink)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    # -- plumbing -------------------------------------------------------------------------------------
    def git(
        self, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        return run_git(args, self.path, input=input, env=env, check=check)

    def out(self, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None) -> str:
        return self.git(*args, input=input, env=env).stdout.decode().strip()

    @cached_property
    def git_dir(self) -> Path:
        dot = self.path / ".git"
        if dot.is_file():  # a linked worktree or a submodule with an absorbed git dir
            return (self.path / dot.read_text().split(":", 1)[1].strip()).resolve()
        return dot

    @cached_property
    def common_dir(self) -> Path:
        pointer = self.git_dir / "commondir"
        if pointer.exists():
            return (self.git_dir / pointer.read_text().strip()).resolve()
        return self.git_dir

    def exists(self) -> bool:
        return self.path.is_dir() and (self.path / ".git").exists()

    def rev_parse(self, rev: str) -> str | None:
        proc = self.git("rev-parse", "--verify", "--quiet", rev, check=False)
        return proc.stdout.decode().strip() or None if proc.returncode == 0 else None

    def config_get(self, key: str) -> str | None:
        proc = self.git("config", "--get", key, check=False)
        return proc.stdout.decode().strip() if proc.returncode == 0 else None

    def config_section(self, section: str) -> dict[str, str]:
        """Every ``section.*`` key of the repository's config in one call (keys lower-cased by git)."""
        proc = self.git("config", "-z", "--get-regexp", f"^{section}\\.", check=False)
        pairs = (item.split("\n", 1) for item in proc.stdout.decode().split("\0") if item)
        return {key: (value[0] if value else "") for key, *value in pairs}

    def rev_parse_many(self, revs: list[str]) -> list[str | None]:
        """Several revisions in one call; None for any that does not resolve."""
        proc = self.git("rev-parse", *revs, check=False)
        lines = proc.stdout.decode().split()
        if proc.returncode == 0 and len(lines) == len(revs):
            return lines
        return [self.rev_parse(rev) for rev in revs]

    def config_set(self, key: str, value: str) -> None:
        self.git("config", key, value)

    def missing_objects(self, oids: Iterable[str]) -> set[str]:
        wanted = sorted(set(oids))
        if not wanted:
            return set()
        text = self.git("cat-file", "--batch-check", input=("\n".join(wanted) + "\n").encode()).stdout.decode()
        return {line.split()[0] for line in text.splitlines() if line.endswith(" missing")}

    def read_blobs(self, oids: Iterable[str], skip_missing: bool = False) -> dict[str, bytes]:
        wanted = list(dict.fromkeys(oids))
        if not wanted:
            return {}
        raw = self.git("cat-file", "--batch", input=("\n".join(wanted) + "\n").encode()).stdout
        blobs: dict[str, bytes] = {}
        pos = 0
        for oid in wanted:
            header_end = raw.index(b"\n", pos)
            header = raw[pos:header_end].split()
            if header[-1] == b"missing":
                if skip_missing:
                    pos = header_end + 1
                    continue
                raise GitError(f"object {oid} is missing from {self.path}")
            size = int(header[2])
            blobs[oid] = raw[header_end + 1 : header_end + 1 + size]
            pos = header_end + 1 + size + 1
        return blobs

    def merge_blobs(self, base: str, ours: str, theirs: str) -> str | None:
        """3-way merge of three blobs with ``git merge-file``; the merged blob's id, or None on conflict."""
        blobs = self.read_blobs([base, ours, theirs])
        with tempfile.TemporaryDirectory(prefix="specpilot-merge-") as tmp:
            for name, oid in (("ours", ours), ("base", base), ("theirs", theirs)):
                Path(tmp, name).write_bytes(blobs[oid])
            proc = run_git(["merge-file", "-p", "-q", "ours", "base", "theirs"], tmp, check=False)
        if proc.returncode < 0 or proc.returncode >= 128:
            raise GitError(
                f"git merge-file failed: {proc.stderr.decode(errors='replace').strip()}", where=str(self.path)
            )
        return None if proc.returncode else self.write_blob(proc.stdout)

    def write_blob(self, content: bytes) -> str:
        return self.write_object("blob", content)

    def write_object(self, kind: str, content: bytes) -> str:
        """Write a loose object (no-op if present); the id is computed exactly as git does."""
        oid = object_id(kind, content)
        folder = self.common_dir / "objects" / oid[:2]
        target = folder / oid[2:]
        if target.exists():  # a copy in a pack is harmless to duplicate loosely
            return oid
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix="tmp_obj_")
        with os.fdopen(fd, "wb") as handle:
            handle.write(zlib.compress(b"%s %d\0" % (kind.encode(), len(content)) + content, 1))
        os.chmod(tmp, 0o444)
        os.replace(tmp, target)
        return oid

    def ls_tree(self, treeish: str) -> list[tuple[str, str, str, str]]:
        """Every entry (mode, type, oid, path) recursively, trees included."""
        raw = self.git("ls-tree", "-r", "-t", "-z", "--full-tree", treeish).stdout
        rows = []
        for item in raw.split(b"\0"):
            if not item:
                continue
            meta, path = item.split(b"\t", 1)
            mode, kind, oid = meta.decode().split()
            rows.append((mode, kind, oid, path.decode()))
        return rows

    def update_refs(self, updates: Mapping[str, tuple[str | None, str | None]], message: str) -> None:
        """One atomic transaction: ref -> (old or None for 'must not exist', new or None for delete)."""
        if not updates:
            return
        lines = ["start"]
        for ref, (old, new) in sorted(updates.items()):
            if new is None:
                lines.append(f"delete {ref} {old or ''}".rstrip())
            else:
                lines.append(f"update {ref} {new} {old or ZERO_OID}")
        lines += ["prepare", "commit", ""]
        proc = self.git("update-ref", "-m", message, "--stdin", input="\n".join(lines).encode(), check=False)
        if proc.returncode != 0:
            raise ForkError(
                "the fork's refs changed while this command ran; nothing was updated",
                where=str(self.path),
                fix=f"run the command again ({proc.stderr.decode().strip()})",
            )

    def refs(self, prefix: str) -> dict[str, str]:
        text = self.out("for-each-ref", "--format=%(refname) %(objectname)", prefix)
        return dict(line.split() for line in text.splitlines())

    def ref_trees(self, prefix: str) -> dict[str, str]:
        """ref -> the tree of the commit it points at, for every ref under ``prefix``, in one call."""
        text = self.out("for-each-ref", "--format=%(refname) %(tree)", prefix)
        return {ref: tree for ref, tree in (line.split() for line in text.splitlines()) if tree}

    @contextmanager
    def temporary_index(self):
        """A throw-away index file, so the fork's own index and work tree are never touched."""
        fd, path = tempfile.mkstemp(prefix="specpilot-index-", dir=self.git_dir)
        os.close(fd)
        os.unlink(path)
        try:
            yield {"GIT_INDEX_FILE": path}
        finally:
            if os.path.exists(path):
                os.unlink(path)

    def fast_import(self, stream: Iterable[bytes]) -> None:
        proc = subprocess.Popen(
            # zlib level 1: the object ids do not depend on it, and it halves the import's CPU time
            ["git", *_CONFIG, "-c", "pack.compression=1", "fast-import", "--quiet", "--date-format=raw", "--done"],
            cwd=self.path,
            stdin=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_environment(),
        )
        try:
            for chunk in stream:
                proc.stdin.write(chunk)
            proc.stdin.close()
        except BrokenPipeError:
            pass
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        err = proc.stderr.read().decode(errors="replace")
        if proc.wait() != 0:
            raise GitError(f"git fast-import failed: {err.strip()}", where=str(self.path))

    def is_dirty(self) -> bool:
        return bool(self.git("status", "--porcelain", "--untracked-files=normal").stdout.strip())


def init_repo(path: Path) -> Repo:
    path.mkdir(parents=True, exist_ok=True)
    run_git(["init", "--quiet", "--initial-branch=stock", str(path)], path)
    repo = Repo(path)
    for key, value in (("core.autocrlf", "false"), ("commit.gpgsign", "false"), ("gc.auto", "0")):
        repo.config_set(key, value)
    return repo
