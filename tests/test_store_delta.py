"""Delta parsing: what the resolver reads from a patch, and damage caught at its line."""

from __future__ import annotations

import pytest

from specpilot_mem.errors import DeltaError
from specpilot_mem.store.delta import parse_delta

A, B, EMPTY = "1" * 40, "2" * 40, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
MODIFY = f"""diff --git a/sglang/x.py b/sglang/x.py
index {A}..{B} 100644
--- a/sglang/x.py
+++ b/sglang/x.py
@@ -1,2 +1,3 @@
 one
+two
 three
""".encode()
ADD_BINARY = f"""diff --git a/sglang/b.bin b/sglang/b.bin
new file mode 100644
index {"0" * 40}..{B}
GIT binary patch
literal 5
McmYdfNMc9^00VOYCjbBd

literal 0
HcmV?d00001

""".encode()
DELETE_EMPTY = f"""diff --git a/sglang/e.py b/sglang/e.py
deleted file mode 100644
index {EMPTY}..{"0" * 40}
""".encode()
MODE_ONLY = b"""diff --git a/sglang/run.py b/sglang/run.py
old mode 100644
new mode 100755
"""


def test_parses_every_kind_of_change():
    delta = parse_delta(MODIFY + ADD_BINARY + DELETE_EMPTY + MODE_ONLY, "e", "delta.patch")
    modify, add, delete, mode = delta.changes
    assert (modify.old_oid, modify.new_oid, modify.old_mode, modify.new_mode) == (A, B, "100644", "100644")
    assert add.added and add.binary and add.new_oid == B and add.old_oid is None
    assert delete.deleted and delete.old_oid == EMPTY
    assert mode.mode_only and (mode.old_mode, mode.new_mode) == ("100644", "100755")
    assert parse_delta(b"", "e", "delta.patch").changes == ()


@pytest.mark.parametrize(
    "text, message, line",
    [
        (MODIFY[:-3], "does not end with a newline", 8),
        (MODIFY.rsplit(b"\n", 2)[0] + b"\n", "cut short", 7),
        (MODIFY.replace(b"@@ -1,2 +1,3 @@", b"@@ -1,2 +1,4 @@"), "cut short", 8),
        (MODIFY.replace(b" three", b"?three"), "shorter than its header", 8),
        (ADD_BINARY[:-30] + b"\n", "cut short|wrong length|literal", None),
        (MODIFY.replace(b"index " + A.encode(), b"index 12ab"), "unexpected header line", 2),
        (b"garbage\n", "expected 'diff --git'", 1),
    ],
)
def test_damage_is_caught_with_its_line(text, message, line):
    with pytest.raises(DeltaError, match=message) as err:
        parse_delta(text, "e", "entries/e/delta.patch")
    if line is not None:
        assert err.value.where == f"entries/e/delta.patch:{line}"
    assert "re-record" in err.value.fix


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "../outside.py",
        "sglang/../../x",
        ".git/config",
        "sglang/.git/hooks/post-checkout",
        "sglang/./x.py",
    ],
)
def test_paths_outside_the_tree_or_in_git_are_refused(path):
    text = MODIFY.replace(b"sglang/x.py", path.encode())
    with pytest.raises(DeltaError, match="outside the tree|inside .git"):
        parse_delta(text, "e", "delta.patch")


def test_quoted_and_spaced_paths():
    spaced = MODIFY.replace(b"sglang/x.py", b"sglang/a b.py")
    assert parse_delta(spaced, "e", "d").changes[0].path == "sglang/a b.py"
    quoted = MODIFY.replace(
        b"diff --git a/sglang/x.py b/sglang/x.py", b'diff --git "a/sglang/t\\tab.py" "b/sglang/t\\tab.py"'
    )
    assert parse_delta(quoted, "e", "d").changes[0].path == "sglang/t\tab.py"


def test_hunks_apply_at_an_offset_and_refuse_changed_context():
    from specpilot_mem.store.delta import apply_hunks

    hunks = parse_delta(MODIFY, "e", "d").changes[0].hunks
    assert apply_hunks(b"one\nthree\n", hunks) == (b"one\ntwo\nthree\n", ())
    assert apply_hunks(b"one\nthree\ntail\n", hunks) == (b"one\ntwo\nthree\ntail\n", ())
    # a hunk at line 1 must match at the beginning, as in `git apply` (elsewhere it would be a guess)
    assert apply_hunks(b"zero\nextra\none\nthree\ntail\n", hunks) is None
    moved = parse_delta(MODIFY.replace(b"@@ -1,2 +1,3 @@", b"@@ -2,2 +2,3 @@"), "e", "d").changes[0].hunks
    assert apply_hunks(b"zero\nextra\none\nthree\ntail\n", moved) == (b"zero\nextra\none\ntwo\nthree\ntail\n", ())
    assert apply_hunks(b"one\nTHREE\n", hunks) is None
    no_newline = parse_delta(MODIFY.replace(b" three\n", b" three\n\\ No newline at end of file\n"), "e", "d")
    assert apply_hunks(b"one\nthree", no_newline.changes[0].hunks) == (b"one\ntwo\nthree", ())
    assert apply_hunks(b"one\nthree\n", no_newline.changes[0].hunks) is None
