"""Helpers for the store tests: fork commits made with git plumbing (no work-tree checkout, so fast)."""

from __future__ import annotations

from specpilot_mem.git import Repo
from specpilot_mem.home import Home
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import Resolver

DRAFT = {
    "title": "test entry",
    "summary": "made by the store tests",
    "contract": {"level": "bit-exact", "statement": "with defaults it behaves as stock"},
}


def commit_files(repo: Repo, base: str, files: dict[str, bytes | None], message: str = "edit") -> str:
    """A commit on ``base`` (rev or tree) with ``files`` written (None deletes), made on a scratch index."""
    with repo.temporary_index() as env:
        repo.git("read-tree", base, env=env)
        for path, content in files.items():
            if content is None:
                repo.git("update-index", "--force-remove", "--", path, env=env)
            else:
                oid = repo.write_blob(content)
                repo.git("update-index", "--add", "--cacheinfo", f"100644,{oid},{path}", env=env)
        tree = repo.out("write-tree", env=env)
    return repo.out("commit-tree", tree, "-m", message)


def source_on(home: Home, requires: list[str], files: dict[str, bytes | None]) -> str:
    """A fork commit built on stock + ``requires`` (as an agent's work would be) with ``files`` changed."""
    fork = open_fork(home)
    resolver = Resolver(fork)
    walk = resolver.walk(fork.stock_tree, resolver.chain(requires))
    base = resolver.tree_id(fork.stock_tree, walk, write=True)
    return commit_files(fork.repo, base, files)


def stock_text(home: Home, path: str) -> bytes:
    return open_fork(home).repo.git("cat-file", "blob", f"stock:{path}").stdout


def append_line(home: Home, path: str, line: str, requires: list[str] | None = None) -> bytes:
    """The file at ``path`` in stock + requires, with ``line`` appended."""
    fork = open_fork(home)
    resolver = Resolver(fork)
    walk = resolver.walk(fork.stock_tree, resolver.chain(requires or []))
    entry = walk.overlay.get(path) or resolver.base(fork.stock_tree).files[path]
    return fork.repo.read_blobs([entry[1]])[entry[1]] + line.encode() + b"\n"


SLOTS = 12


def slotted(name: str) -> bytes:
    """A file with numbered slots far enough apart that edits to different slots merge cleanly."""
    return "".join(f"{name} slot {k}\npad a\npad b\npad c\n" for k in range(SLOTS)).encode()


def set_slot(content: bytes, name: str, slot: int, text: str) -> bytes:
    return content.replace(f"{name} slot {slot}\n".encode(), f"{name} slot {slot}: {text}\n".encode())


def make_user_fork(folder) -> str:
    """A small SGLang-shaped git repository (package under python/) standing in for a user's fork."""
    from specpilot_mem.git import init_repo

    repo = init_repo(folder)
    commit = commit_files(
        repo,
        "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
        {
            "README.md": b"my fork\n",
            "python/sglang/__init__.py": b"",
            "python/sglang/shared.py": slotted("shared"),
            "python/sglang/srt/server_args.py": b"ARGS = []\n",
        },
        "stock",
    )
    repo.git("update-ref", "refs/heads/main", commit)
    return commit


def synthetic_home(tmp_path):
    """A memory home on a small user fork (``init --fork-url ... --package-prefix python/``)."""
    from specpilot_mem.store import init_memory

    make_user_fork(tmp_path / "upstream")
    (tmp_path / "home" / "entries").mkdir(parents=True)
    home = Home(tmp_path / "home")
    init_memory(home, fork_url=str(tmp_path / "upstream"), stock_rev="main", package_prefix="python/")
    return home


def fork_file(home: Home, requires: list[str], path: str) -> bytes:
    """``path`` (relative to the package prefix) in stock + ``requires``."""
    fork = open_fork(home)
    resolver = Resolver(fork)
    walk = resolver.walk(fork.stock_tree, resolver.chain(requires))
    full = fork.package_prefix + path
    entry = walk.overlay[full] if full in walk.overlay else resolver.base(fork.stock_tree).files[full]
    return fork.repo.read_blobs([entry[1]])[entry[1]]


def prefixed_source(home: Home, requires: list[str], files: dict[str, bytes | None]) -> str:
    prefix = open_fork(home).package_prefix
    return source_on(home, requires, {prefix + p: c for p, c in files.items()})
