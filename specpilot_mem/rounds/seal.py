"""Sealed trees: the exact bytes the controller measures, checked against their git tree id.

Before a system is measured, its commit's tree is written out of the object store into
``<home state>/sealed/<tree id>/`` (read-only), and the tree id is computed again from the files on
disk with git's own hashing: the folder holds exactly that tree, nothing more and nothing less. The
controller checks it again before and after measuring, and the promotion merge must carry the same
tree. A symlink that points outside the tree (absolute, or climbing above its root) is refused: a
system must not read or write outside what was sealed through one.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
import tempfile
from pathlib import Path

from specpilot_mem.errors import RoundError
from specpilot_mem.git import Repo, object_id, tree_content

SYMLINK, EXECUTABLE, REGULAR, TREE = "120000", "100755", "100644", "40000"


class SealError(RoundError):
    """A tree that cannot be sealed, or a sealed folder whose bytes are not its tree."""


def escaping_symlinks(repo: Repo, treeish: str) -> list[str]:
    """Symlinks in ``treeish`` whose target leaves the tree: ``path -> target`` for each."""
    links = [(path, oid) for mode, _, oid, path in repo.ls_tree(treeish) if mode == SYMLINK]
    blobs = repo.read_blobs([oid for _, oid in links])
    escaping = []
    for path, oid in links:
        target = blobs[oid].decode(errors="replace")
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            escaping.append(f"{path} -> {target}")
    return escaping


def directory_tree_id(root: Path) -> str:
    """The git tree id of the files under ``root`` (modes and bytes as git records them)."""
    entries: dict[str, tuple[str, str]] = {}
    for name in sorted(os.listdir(root)):
        path = root / name
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            entries[name] = (SYMLINK, object_id("blob", os.fsencode(os.readlink(path))))
        elif stat.S_ISDIR(info.st_mode):
            if not os.listdir(path):
                raise SealError(
                    f"sealed folder holds an empty folder {path}, which no git tree has",
                    where=str(root),
                    fix="re-seal the tree",
                )
            entries[name] = (TREE, directory_tree_id(path))
        elif stat.S_ISREG(info.st_mode):
            mode = EXECUTABLE if info.st_mode & stat.S_IXUSR else REGULAR
            entries[name] = (mode, object_id("blob", path.read_bytes()))
        else:
            raise SealError(
                f"sealed folder holds {path}, which is neither a file, a folder nor a symlink",
                where=str(root),
                fix="re-seal the tree",
            )
    return object_id("tree", tree_content(entries))


def _write_tree(repo: Repo, tree: str, dest: Path) -> None:
    rows = repo.ls_tree(tree)
    gitlinks = [path for mode, _, _, path in rows if mode == "160000"]
    if gitlinks:
        raise SealError(
            f"tree {tree} holds submodules {gitlinks[:3]}",
            where=str(repo.path),
            fix="a measured system's tree must hold its files, not submodules",
        )
    blobs = repo.read_blobs([oid for _, kind, oid, _ in rows if kind == "blob"])
    for mode, kind, oid, path in rows:
        target = dest / path
        if kind == "tree":
            target.mkdir(parents=True, exist_ok=True)
        elif mode == SYMLINK:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(blobs[oid], target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blobs[oid])
            target.chmod(0o555 if mode == EXECUTABLE else 0o444)


def _read_only(root: Path, writable: bool = False) -> None:
    for folder, _dirs, _ in os.walk(root, topdown=False):
        os.chmod(folder, 0o755 if writable else 0o555)


def seal_tree(repo: Repo, commit: str, root: Path) -> tuple[str, Path]:
    """Write ``commit``'s tree to ``root/<tree id>`` (or reuse a copy that still hashes to it) and
    return (tree id, folder). Refuses trees with symlinks that leave them."""
    tree = repo.rev_parse(f"{commit}^{{tree}}")
    if tree is None:
        raise SealError(f"commit {commit} is not in {repo.path}", where=str(repo.path), fix="record the patch first")
    escaping = escaping_symlinks(repo, tree)
    if escaping:
        raise SealError(
            f"tree {tree} has symlinks that point outside it: {escaping}",
            where=str(repo.path),
            fix="a system may only link within its own tree",
        )
    dest = root / tree
    if dest.is_dir():
        try:
            if directory_tree_id(dest) == tree:
                return tree, dest
        except (SealError, OSError):
            pass
        _read_only(dest, writable=True)
        shutil.rmtree(dest)
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{tree[:12]}-", dir=root))
    _write_tree(repo, tree, scratch)
    got = directory_tree_id(scratch)
    if got != tree:
        raise SealError(
            f"the export of {tree} hashes to {got}", where=str(scratch), fix="report this: git and the export disagree"
        )
    _read_only(scratch)
    os.replace(scratch, dest)
    return tree, dest


def verify_sealed(folder: Path, tree: str) -> None:
    """Refuse to measure ``folder`` unless its bytes are exactly ``tree``."""
    got = directory_tree_id(Path(folder))
    if got != tree:
        raise SealError(
            f"the sealed folder {folder} hashes to tree {got}, not {tree}: its bytes changed",
            where=str(folder),
            fix="nothing is measured on changed bytes; `round resume` seals it again",
        )
