"""``init``: build the fork (pinned wheel or a user's fork) if needed, then materialize every entry.

Idempotent: an existing fork whose stock matches is kept, and branches already at their
deterministic commits are left alone, so a second run changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specpilot_mem.errors import ForkError
from specpilot_mem.git import Repo
from specpilot_mem.home import Home
from specpilot_mem.store.branches import BranchState, sync_branches
from specpilot_mem.store.fork import Fork, build_pinned_fork, build_user_fork, open_fork, write_excludes
from specpilot_mem.store.resolver import Resolver
from specpilot_mem.store.stock import fetch_wheel

GITLINK_MODE = "160000"


@dataclass
class InitResult:
    fork: Fork
    built: bool
    branches: list[BranchState] = field(default_factory=list)
    gitlink: str = "absent"  # matches | differs | absent: the project's recorded sglang-fork commit
    wheel: str | None = None  # what was done with --wheel

    @property
    def failed(self) -> list[BranchState]:
        return [b for b in self.branches if b.change == "failed"]


def project_gitlink(home: Home) -> str | None:
    """The commit the project repository records for ``sglang-fork`` (None outside a git project)."""
    project = Repo(home.root)
    if not (home.root / ".git").exists():
        return None
    line = project.git("ls-files", "--stage", "--", home.fork.name, check=False).stdout.decode().strip()
    if not line.startswith(GITLINK_MODE):
        return None
    return line.split()[1]


def init_memory(
    home: Home,
    wheel: str | None = None,
    fork_url: str | None = None,
    stock_rev: str | None = None,
    package_prefix: str = "",
    checkout: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> InitResult:
    """Build the fork if needed, then the entry branches; ``progress(done, total)`` follows the import."""
    if fork_url and wheel:
        raise ForkError(
            "--wheel and --fork-url exclude each other",
            where="--wheel",
            fix="pass --wheel to build stock from the pinned SGLang wheel, or --fork-url for your own fork",
        )
    if fork_url and not stock_rev:
        raise ForkError(
            "--fork-url needs --stock-rev",
            where="--stock-rev",
            fix="name the branch, tag or commit of your fork that is its stock",
        )
    built = False
    try:
        fork = open_fork(home)
    except ForkError:
        if (home.fork / ".git").exists():
            if Repo(home.fork).config_get("specpilot.stock") is None:
                raise ForkError(
                    f"{home.fork} is a git repository that specpilot-mem did not build",
                    where=str(home.fork),
                    fix="move it away and run `specpilot-mem init`; for your own SGLang fork pass "
                    "--fork-url PATH --stock-rev REV",
                ) from None
            raise
        fork = (
            build_user_fork(home, fork_url, stock_rev, package_prefix)
            if fork_url
            else build_pinned_fork(home, wheel, checkout, progress)
        )
        built = True
    if fork_url and not built and fork.pinned:
        raise ForkError(
            f"{home.fork} already holds another stock",
            where=str(home.fork),
            fix="move sglang-fork away to build a fork from --fork-url",
        )
    note = None
    if wheel is not None:
        path = fetch_wheel(wheel)  # sha256 against the pin (and whether it is a zip at all), built or not
        if built:
            note = f"{path}: sha256 matches the pin; stock was built from it"
        elif not fork.pinned:
            raise ForkError(
                f"{home.fork} was built from your fork, not from the pinned wheel",
                where="--wheel",
                fix="leave out --wheel (it only builds stock from the pinned SGLang wheel)",
            )
        else:
            note = f"{path}: sha256 matches the pin; the fork already exists, so nothing was rebuilt"
    with fork.lock():
        write_excludes(fork.repo)
        branches = sync_branches(Resolver(fork))
    link = project_gitlink(home)
    gitlink = "absent" if link is None else ("matches" if link == fork.stock_commit else "differs")
    if link is not None and (home.root / ".gitmodules").is_file():
        # register the submodule in the project's config, so `git submodule status` sees it as checked out
        Repo(home.root).git("submodule", "init", "--", home.fork.name, check=False)
    return InitResult(fork, built, branches, gitlink, note)
