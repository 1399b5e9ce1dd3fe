"""Entry deltas: binary-safe full-index diffs (``entries/<id>/delta.patch``), parsed and checked.

The resolver needs only each file's pre- and post-image blob ids and modes (from the ``index`` and
mode lines), so it applies a delta by editing trees in memory. The text is still checked for
structure here (a truncated hunk or binary literal is caught at its line), every path is checked to
stay inside the tree, and ``hydrate`` runs ``git apply`` once per delta content to prove the text
really produces the blob ids it declares.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from specpilot_mem.errors import DeltaError

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INDEX = re.compile(rb"^index ([0-9a-f]{40})\.\.([0-9a-f]{40})(?: ([0-7]{6}))?$")
_BINARY_SIZE = re.compile(rb"^(literal|delta) (\d+)$")
_MODE = re.compile(rb"^[0-7]{6}$")
_NULL = "0" * 40
_ESCAPES = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


@dataclass(frozen=True)
class Hunk:
    """One text hunk: the lines it expects (context and removed) and what replaces them, endings kept.
    ``trailing``: its context lines after the last change (none: the hunk ends at the end of the file)."""

    old_start: int
    before: tuple[bytes, ...]
    after: tuple[bytes, ...]
    new_start: int = 0
    trailing: int = 0


@dataclass(frozen=True)
class FileChange:
    """One file in a delta. ``None`` modes/oids mean absent (added or deleted); ``old_oid == new_oid``
    with different modes is a mode-only change (git writes no index line, so both are ``None``)."""

    path: str
    old_mode: str | None
    new_mode: str | None
    old_oid: str | None
    new_oid: str | None
    binary: bool = False
    hunks: tuple[Hunk, ...] = ()

    @property
    def added(self) -> bool:
        return self.old_mode is None

    @property
    def deleted(self) -> bool:
        return self.new_mode is None

    @property
    def mode_only(self) -> bool:
        return self.old_oid is None and self.new_oid is None and not self.added and not self.deleted


@dataclass(frozen=True)
class Delta:
    entry_id: str
    sha256: str
    text: bytes = field(repr=False)
    changes: tuple[FileChange, ...]

    def paths(self) -> list[str]:
        return [c.path for c in self.changes]


def check_path(path: str, where: str) -> str:
    """A delta path must be relative, inside the tree, and never under ``.git``."""
    parts = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or "\0" in path
        or any(p in ("", ".", "..") for p in parts)
        or re.match(r"^[A-Za-z]:", path)
    ):
        raise DeltaError(
            f"the delta touches {path!r}, which is outside the tree (absolute or with '..'/'.' parts)",
            where=where,
            fix="re-record the entry from a fork commit; deltas only hold paths inside the tree",
        )
    if any(p.lower() == ".git" for p in parts):
        raise DeltaError(
            f"the delta touches {path!r} inside .git/",
            where=where,
            fix="re-record the entry; git's own files are never part of an entry",
        )
    return path


SYMLINK_MODE = "120000"


def check_symlink(path: str, target: bytes, where: str) -> None:
    """A symlink an entry adds must point inside the tree: relative, and never climbing above the root."""
    text = target.decode("utf-8", errors="replace")
    depth = path.count("/")  # folders between the root and the link
    for part in text.split("/"):
        depth = depth - 1 if part == ".." else depth if part in ("", ".") else depth + 1
        if depth < 0:
            break
    if text.startswith("/") or depth < 0 or "\0" in text or re.match(r"^[A-Za-z]:", text):
        raise DeltaError(
            f"{path} is a symlink to {text!r}, which points outside the tree",
            where=where,
            fix="entries may only add symlinks to files inside the tree (relative, "
            "without climbing above its root); copy the file in instead",
        )


def _unquote(text: str) -> str:
    """git's C-style path quoting (used for names with special characters)."""
    if not text.startswith('"'):
        return text
    body, out, i = text[1:-1], bytearray(), 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            nxt = body[i + 1]
            if nxt in "01234567":
                out.append(int(body[i + 1 : i + 4], 8))
                i += 4
                continue
            out += _ESCAPES[nxt].encode()
            i += 2
            continue
        out += ch.encode()
        i += 1
    return out.decode("utf-8", errors="surrogateescape")


def _header_path(line: str) -> str:
    rest = line[len("diff --git ") :]
    if rest.startswith('"'):
        end = rest.index('" ', 1)
        return _unquote(rest[: end + 1])[2:]
    # no renames: "a/X b/X", so X has length (len - 5) / 2 even when it holds spaces
    length = (len(rest) - 5) // 2
    return rest[2 : 2 + length]


def parse_delta(text: bytes, entry_id: str, where: str) -> Delta:
    """Parse and structurally check a delta; any damage raises ``DeltaError`` naming the line."""
    lines = text.split(b"\n")
    if text and not text.endswith(b"\n"):
        raise DeltaError(
            "the delta is truncated (it does not end with a newline)",
            where=f"{where}:{len(lines)}",
            fix=f"restore it from git, or re-record the entry with `specpilot-mem record {entry_id}`",
        )
    lines = lines[:-1] if text else []
    changes: list[FileChange] = []
    i = 0

    def fail(message: str, at: int) -> DeltaError:
        return DeltaError(
            f"corrupted delta: {message}",
            where=f"{where}:{at + 1}",
            fix=f"restore it from git, or re-record the entry with `specpilot-mem record {entry_id}`",
        )

    while i < len(lines):
        line = lines[i]
        if not line.startswith(b"diff --git "):
            raise fail(f"expected 'diff --git', found {line[:60]!r}", i)
        path = check_path(_header_path(line.decode("utf-8", errors="surrogateescape")), f"{where}:{i + 1}")
        i += 1
        old_mode = new_mode = old_oid = new_oid = None
        added = deleted = False
        while i < len(lines) and not lines[i].startswith(
            (b"diff --git ", b"--- ", b"GIT binary patch", b"Binary files")
        ):
            meta = lines[i]
            if meta.startswith(b"new file mode "):
                added, new_mode = True, meta.split()[-1].decode()
            elif meta.startswith(b"deleted file mode "):
                deleted, old_mode = True, meta.split()[-1].decode()
            elif meta.startswith(b"old mode "):
                old_mode = meta.split()[-1].decode()
            elif meta.startswith(b"new mode "):
                new_mode = meta.split()[-1].decode()
            elif match := _INDEX.match(meta):
                old_oid, new_oid = match.group(1).decode(), match.group(2).decode()
                if match.group(3):
                    old_mode = new_mode = match.group(3).decode()
            else:
                raise fail(f"unexpected header line {meta[:60]!r}", i)
            i += 1
        for mode in (old_mode, new_mode):
            if mode is not None and not _MODE.match(mode.encode()):
                raise fail(f"bad file mode {mode!r}", i - 1)
        if added:
            old_mode, old_oid = None, None if old_oid in (None, _NULL) else old_oid
            if old_oid is not None or new_oid is None:
                raise fail(f"{path}: a new file needs an index line 0000..<blob>", i - 1)
        if deleted:
            new_mode, new_oid = None, None if new_oid in (None, _NULL) else new_oid
            if new_oid is not None or old_oid is None:
                raise fail(f"{path}: a deleted file needs an index line <blob>..0000", i - 1)
        if not added and not deleted and old_oid is None and (old_mode is None or new_mode is None):
            raise fail(f"{path}: no index line (a full-index diff names both blobs)", i - 1)
        binary, hunks = False, []
        if i < len(lines) and lines[i].startswith(b"Binary files"):
            raise fail(f"{path}: binary change without data (the delta must be made with --binary)", i)
        if i < len(lines) and lines[i] == b"GIT binary patch":
            binary = True
            i = _check_binary(lines, i + 1, fail)
        elif i < len(lines) and lines[i].startswith(b"--- "):
            if i + 1 >= len(lines) or not lines[i + 1].startswith(b"+++ "):
                raise fail(f"{path}: '---' without '+++'", i)
            i = _read_hunks(lines, i + 2, fail, hunks)
        elif (
            (old_oid is not None or new_oid is not None)
            and old_oid != new_oid
            and _EMPTY_BLOB not in (old_oid if deleted else None, new_oid if added else None)
        ):
            raise fail(f"{path}: the content changes but the delta has no hunks", i)
        changes.append(FileChange(path, old_mode, new_mode, old_oid, new_oid, binary, tuple(hunks)))
    seen = [c.path for c in changes]
    if len(set(seen)) != len(seen):
        raise DeltaError("the delta changes a path twice", where=where, fix=f"re-record the entry {entry_id}")
    return Delta(entry_id, hashlib.sha256(text).hexdigest(), text, tuple(changes))


_EMPTY_BLOB = "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"


def _read_hunks(lines: list[bytes], i: int, fail, hunks: list[Hunk]) -> int:
    """Read the hunks of one file into ``hunks``, checking each against its header's line counts."""
    if i >= len(lines) or not lines[i].startswith(b"@@ "):
        raise fail("expected a hunk header '@@'", i)
    while i < len(lines) and lines[i].startswith(b"@@ "):
        match = _HUNK.match(lines[i])
        if not match:
            raise fail(f"bad hunk header {lines[i][:60]!r}", i)
        old_left = int(match.group(2) or b"1")
        new_left = int(match.group(4) or b"1")
        before: list[bytes] = []
        after: list[bytes] = []
        last: list[list[bytes]] = []
        trailing = 0
        i += 1
        while old_left > 0 or new_left > 0 or (i < len(lines) and lines[i][:1] == b"\\"):
            if i >= len(lines):
                raise fail("the last hunk is cut short (truncated delta)", i - 1)
            tag, text = lines[i][:1], lines[i][1:] + b"\n"
            trailing = trailing + 1 if tag == b" " else 0 if tag in (b"-", b"+") else trailing
            if tag == b" ":
                old_left, new_left = old_left - 1, new_left - 1
                before.append(text)
                after.append(text)
                last = [before, after]
            elif tag == b"-":
                old_left -= 1
                before.append(text)
                last = [before]
            elif tag == b"+":
                new_left -= 1
                after.append(text)
                last = [after]
            elif tag == b"\\":  # "\ No newline at end of file": the previous line has no newline
                for side in last:
                    side[-1] = side[-1][:-1]
                last = []
            else:
                raise fail(f"hunk line starts with {tag!r}; the hunk is shorter than its header says", i)
            if old_left < 0 or new_left < 0:
                raise fail("the hunk is longer than its header says", i)
            i += 1
        hunks.append(Hunk(int(match.group(1)), tuple(before), tuple(after), int(match.group(3)), trailing))
    return i


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their ``\\n`` kept (only ``\\n`` separates lines, as in git; ``\\r`` stays content)."""
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def apply_hunks(content: bytes, hunks: tuple[Hunk, ...]) -> tuple[bytes, tuple[int, ...]] | None:
    """Apply hunks as ``git apply`` does without fuzz: each hunk's lines must match exactly, at its
    position shifted by the offset so far, searching outward (a hunk starting at line 1 must match at
    the beginning, one without trailing context at the end); None if one does not match.

    A hunk whose post-image already stands there (it reverse-applies) is left alone, so a change the
    content already has is never made twice. Returns (new content, 1-based numbers of those hunks).
    """
    lines = split_lines(content)
    out: list[bytes] = []
    present: list[int] = []
    pos = offset = 0
    for number, hunk in enumerate(hunks, 1):
        size = len(hunk.before)
        origin = max(hunk.old_start - 1, 0) if size else max(hunk.old_start, 0)
        expected = min(max(origin + offset, pos), len(lines))
        # the post-image first: where both match (an insertion at the end), the change is already made
        images = [(hunk.after, hunk.new_start, True)] if hunk.after else []
        images.append((hunk.before, hunk.old_start, False))

        def fits(start: int, image: tuple[bytes, ...], first_line: int, pos: int = pos, hunk: Hunk = hunk) -> bool:
            end = start + len(image)
            return (
                pos <= start
                and end <= len(lines)
                and (first_line > 1 or start == 0)
                and (hunk.trailing or end == len(lines))
                and tuple(lines[start:end]) == image
            )

        found = None
        for distance in range(len(lines) + 1):
            starts = (expected,) if distance == 0 else (expected - distance, expected + distance)
            found = next(
                (
                    (start, image, already)
                    for start in starts
                    for image, first_line, already in images
                    if fits(start, image, first_line)
                ),
                None,
            )
            if found or (expected - distance < pos and expected + distance > len(lines)):
                break
        if found is None:
            return None
        start, image, already = found
        out.extend(lines[pos:start])
        out.extend(hunk.after)
        if already:
            present.append(number)
        pos = start + len(image)
        offset = pos - (origin + size)
    out.extend(lines[pos:])
    return b"".join(out), tuple(present)


def hunks_present(content: bytes, hunks: tuple[Hunk, ...]) -> tuple[int, ...]:
    """1-based numbers of the hunks whose post-image ``content`` holds and whose pre-image it does not
    (naming what a 3-way merge found already made)."""
    lines = split_lines(content)

    def holds(image: tuple[bytes, ...]) -> bool:
        return any(tuple(lines[i : i + len(image)]) == image for i in range(len(lines) - len(image) + 1))

    return tuple(n for n, h in enumerate(hunks, 1) if h.after and holds(h.after) and not holds(h.before))


def _check_binary(lines: list[bytes], i: int, fail) -> int:
    """Forward and reverse base85 sections, each ``literal|delta N`` + data lines + a blank line."""
    for _section in range(2):
        if i >= len(lines) or not _BINARY_SIZE.match(lines[i]):
            raise fail("expected 'literal N' or 'delta N' in a binary patch (truncated delta)", i)
        i += 1
        while i < len(lines) and lines[i]:
            data = lines[i]
            count = data[0] - (ord("A") - 1) if data[:1].isupper() else data[0] - (ord("a") - 27)
            if not 1 <= count <= 52 or (len(data) - 1) % 5 or (len(data) - 1) // 5 * 4 < count:
                raise fail("a base85 line has the wrong length", i)
            i += 1
        if i >= len(lines):
            raise fail("the binary patch is cut short (truncated delta)", i - 1)
        i += 1  # the blank line
    return i


def load_delta(path: Path, entry_id: str) -> Delta:
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise DeltaError(
            f"entry {entry_id} has no delta",
            where=str(path),
            fix=f"re-record it with `specpilot-mem record {entry_id} --from REV`",
        ) from None
    return parse_delta(text, entry_id, str(path))
