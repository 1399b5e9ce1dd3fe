"""The SGLang fork at ``<home>/sglang-fork``: opening it, its stock, its lock, and building it (``init``).

The fork's own git config remembers where stock came from (``specpilot.*`` keys): the pinned wheel,
or a user's fork (``--fork-url``, ``--stock-rev``, ``--package-prefix``), whose stock is checked
against what was recorded at init instead of the pin.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specpilot_mem.errors import ForkError
from specpilot_mem.git import Repo, init_repo, run_git
from specpilot_mem.home import Home
from specpilot_mem.store import stock as stock_import

STOCK_REF = "refs/heads/stock"
ENTRY_REF_PREFIX = "refs/heads/entry/"
# Writing ~5,800 files is I/O-bound: parallel checkout overlaps it even on 2 cores.
CHECKOUT_WORKERS = 4
# Files a work tree grows when SGLang is imported from it; never part of an entry.
IGNORED = "__pycache__/\n*.pyc\n*.pyo\n.pytest_cache/\n.hypothesis/\n"


@dataclass
class Fork:
    home: Home
    repo: Repo
    stock_commit: str
    stock_tree: str
    package_prefix: str  # "" for the wheel import, e.g. "python/" for an SGLang source checkout
    pinned: bool  # stock is the pinned wheel import

    @contextmanager
    def lock(self, shared: bool = False):
        """Use of the fork: ``shared`` for commands that only read it (they run side by side), else
        exclusive; waits for a holder and names it when the wait runs out (``specpilot_mem.file_lock``)."""
        from specpilot_mem.file_lock import file_lock

        with file_lock(self.repo.common_dir / "specpilot.lock", shared=shared, what=f"the fork {self.repo.path}"):
            yield self

    def entry_ref(self, entry_id: str) -> str:
        return ENTRY_REF_PREFIX + entry_id


def open_fork(home: Home) -> Fork:
    """The initialized fork of ``home``; a clear ``ForkError`` if it is missing or its stock moved."""
    repo = Repo(home.fork)
    config = repo.config_section("specpilot") if repo.exists() else {}
    if "specpilot.stock" not in config:
        raise ForkError(
            f"no SGLang fork at {home.fork}",
            where=str(home.fork),
            fix="run `specpilot-mem init` (it builds the fork from the pinned SGLang wheel)",
        )
    recorded = config["specpilot.stock"]
    pinned = config.get("specpilot.pinned") == "true"
    current, tree = repo.rev_parse_many([STOCK_REF, f"{STOCK_REF}^{{tree}}"])
    expected = stock_import.STOCK_COMMIT if pinned else recorded
    if current != expected or recorded != expected:
        raise ForkError(
            f"the fork's stock branch is at {current}, not the {'pinned' if pinned else 'recorded'} stock {expected}",
            where=f"{home.fork} ({STOCK_REF})",
            fix=f"restore it with `git -C {home.fork} update-ref {STOCK_REF} {expected}`, or rebuild the fork "
            "(move sglang-fork away and run `specpilot-mem init`)",
        )
    if pinned and tree != stock_import.STOCK_TREE:
        raise ForkError(
            f"the fork's stock tree is {tree}, not the pinned {stock_import.STOCK_TREE}",
            where=str(home.fork),
            fix="move sglang-fork away and run `specpilot-mem init`",
        )
    return Fork(home, repo, current, tree, config.get("specpilot.packageprefix", ""), pinned)


def _place(built: Path, target: Path) -> None:
    """Move a freshly built fork into place; an empty folder (a cloned submodule path) is replaced."""
    if target.exists():
        if any(target.iterdir()):
            raise ForkError(
                f"{target} exists and is not a SpecPilot fork",
                where=str(target),
                fix="move it away, then run `specpilot-mem init` again",
            )
        target.rmdir()
    os.replace(built, target)


def _scratch(home: Home) -> Path:
    home.state.mkdir(parents=True, exist_ok=True)
    path = home.state / f"fork-build-{os.getpid()}"
    shutil.rmtree(path, ignore_errors=True)
    return path


def _finish(repo: Repo, stock_commit: str, prefix: str, pinned: bool) -> None:
    repo.config_set("specpilot.stock", stock_commit)
    repo.config_set("specpilot.packageprefix", prefix)
    repo.config_set("specpilot.pinned", "true" if pinned else "false")
    write_excludes(repo)


def write_excludes(repo: Repo) -> None:
    """What work trees of the fork never record (``info/exclude`` is shared by every worktree)."""
    exclude = repo.common_dir / "info" / "exclude"
    exclude.parent.mkdir(parents=True, exist_ok=True)
    if not exclude.exists() or exclude.read_text() != IGNORED:
        exclude.write_text(IGNORED)


def build_pinned_fork(
    home: Home, wheel: str | None, checkout: bool = True, progress: Callable[[int, int], None] | None = None
) -> Fork:
    """Import the pinned wheel into a new fork at ``home.fork`` (built aside, moved in when complete).

    ``checkout=False`` leaves the work tree empty: the resolver never needs it, and writing ~5,800
    files is half of init's time; a project checkout wants it, so the submodule looks clean.
    """
    wheel_path = stock_import.fetch_wheel(wheel)
    scratch = _scratch(home)
    try:
        repo = init_repo(scratch)
        commit, _tree = stock_import.import_stock(repo, wheel_path, progress)
        repo.update_refs({STOCK_REF: (None, commit)}, "specpilot: stock from the pinned wheel")
        repo.git("symbolic-ref", "HEAD", STOCK_REF)
        if checkout:
            repo.git("-c", f"checkout.workers={CHECKOUT_WORKERS}", "read-tree", "--reset", "-u", STOCK_REF)
        repo.config_set("specpilot.wheelsha256", stock_import.WHEEL_SHA256)
        _finish(repo, commit, "", pinned=True)
        _place(scratch, home.fork)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return open_fork(home)


def build_user_fork(home: Home, url: str, stock_rev: str, package_prefix: str) -> Fork:
    """Clone a user's own SGLang fork; its ``stock_rev`` becomes this fork's stock."""
    prefix = package_prefix.strip("/")
    prefix = f"{prefix}/" if prefix else ""
    scratch = _scratch(home)
    try:
        proc = run_git(["clone", "--quiet", "--no-checkout", url, str(scratch)], home.root, check=False)
        if proc.returncode != 0:
            raise ForkError(
                f"could not clone {url}: {proc.stderr.decode().strip()}",
                where="--fork-url",
                fix="pass a git URL or a local path of your SGLang fork",
            )
        repo = Repo(scratch)
        commit = repo.rev_parse(f"{stock_rev}^{{commit}}") or repo.rev_parse(f"origin/{stock_rev}^{{commit}}")
        if commit is None:
            raise ForkError(
                f"{url} has no revision {stock_rev!r}",
                where="--stock-rev",
                fix="name a branch, tag or commit of your fork",
            )
        if repo.rev_parse(f"{commit}:{prefix}sglang") is None:
            raise ForkError(
                f"{stock_rev} has no {prefix}sglang/ package",
                where="--package-prefix",
                fix="pass the folder that holds sglang/ in your fork, e.g. --package-prefix python/",
            )
        old = repo.rev_parse(STOCK_REF)
        repo.update_refs({STOCK_REF: (old, commit)}, "specpilot: stock from the user's fork")
        repo.git("symbolic-ref", "HEAD", STOCK_REF)
        repo.git("-c", f"checkout.workers={CHECKOUT_WORKERS}", "read-tree", "--reset", "-u", STOCK_REF)
        _finish(repo, commit, prefix, pinned=False)
        _place(scratch, home.fork)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return open_fork(home)
