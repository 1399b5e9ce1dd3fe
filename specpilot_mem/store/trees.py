"""Trees in memory: a base tree read once, plus an overlay of changed paths.

The resolver applies deltas by editing the overlay and computes tree ids by re-hashing only the
directories on changed paths (the rest keep the base's ids), so resolving a chain costs no git
process per entry. Trees are written to the object store only when a commit needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from specpilot_mem.git import Repo, object_id, tree_content

Entry = tuple[str, str]  # (mode, oid)
TREE_MODE = "40000"


def split_path(path: str) -> tuple[str, str]:
    parent, _, name = path.rpartition("/")
    return parent, name


class BaseTree:
    """Every blob of one tree (``files``) and every directory's listing (``dirs``), read with one ls-tree."""

    def __init__(self, repo: Repo, tree_id: str):
        self.id = tree_id
        self.files: dict[str, Entry] = {}
        self.dirs: dict[str, dict[str, Entry]] = {"": {}}
        for mode, kind, oid, path in repo.ls_tree(tree_id):
            parent, name = split_path(path)
            if kind == "tree":
                self.dirs.setdefault(path, {})
                self.dirs.setdefault(parent, {})[name] = (TREE_MODE, oid)
            else:
                self.files[path] = (mode, oid)
                self.dirs.setdefault(parent, {})[name] = (mode, oid)


_BASES: dict[str, BaseTree] = {}


def base_tree(repo: Repo, tree_id: str) -> BaseTree:
    """``BaseTree`` of ``tree_id``, kept for the process: a tree id names its content, in any repo."""
    if tree_id not in _BASES:
        if len(_BASES) >= 8:
            _BASES.pop(next(iter(_BASES)))
        _BASES[tree_id] = BaseTree(repo, tree_id)
    return _BASES[tree_id]


_SUBDIR = object()


def overlay_tree_id(
    base: BaseTree, overlay: Mapping[str, Entry | None], write: Callable[[bytes], str] | None = None
) -> str:
    """The id of ``base`` with ``overlay`` (path -> entry, or None for deleted) applied.

    ``write`` receives every new tree object's content (to store it), deepest first.
    """
    if not overlay:
        return base.id
    changed: dict[str, dict[str, object]] = {}
    for path, entry in overlay.items():
        parent, name = split_path(path)
        changed.setdefault(parent, {})[name] = entry
        while parent:
            grand, dirname = split_path(parent)
            changed.setdefault(grand, {})[dirname] = _SUBDIR
            parent = grand
    ids: dict[str, str | None] = {}
    for folder in sorted(changed, key=lambda d: d.count("/") + bool(d), reverse=True):
        listing = dict(base.dirs.get(folder, {}))
        for name, entry in changed[folder].items():
            if entry is _SUBDIR:
                sub = ids[f"{folder}/{name}" if folder else name]
                if sub is None:
                    listing.pop(name, None)
                else:
                    listing[name] = (TREE_MODE, sub)
            elif entry is None:
                listing.pop(name, None)
            else:
                listing[name] = entry
        if not listing and folder:
            ids[folder] = None  # git has no empty directories
            continue
        content = tree_content(listing)
        ids[folder] = write(content) if write else object_id("tree", content)
    return ids[""] or object_id("tree", b"")
