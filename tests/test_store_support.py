"""Helpers for the store tests: fork commits made with git plumbing (no work-tree checkout, so fast)."""

from __future__ import annotations

from specpilot_mem.git import Repo
from specpilot_mem.home import Home
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import Resolver

DRAFT = {"title": "test entry", "summary": "made by the store tests",
         "contract": {"level": "bit-exact", "statement": "with defaults it behaves as stock"}}


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
