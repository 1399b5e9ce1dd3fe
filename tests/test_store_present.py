"""A change the base already has is never made twice: per-hunk 'already present' detection in apply,
checked against ``git apply --3way`` on random files, entries and bases."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_store_support import DRAFT, commit_files, fork_file, prefixed_source, synthetic_home

from specpilot_mem.store import record_entry
from specpilot_mem.store.delta import apply_hunks, parse_delta
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import UNCHANGED, APPLIED, PARTLY, PRESENT, Resolver, apply_entries

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
SHARED = "sglang/shared.py"


@pytest.fixture(scope="module")
def user_home(tmp_path_factory):
    return synthetic_home(tmp_path_factory.mktemp("present"))


def _with_lines(content: bytes, after: str, new: list[str]) -> bytes:
    """``content`` with ``new`` lines inserted after the first line equal to ``after``."""
    lines = content.decode().splitlines(keepends=True)
    at = lines.index(after + "\n") + 1
    return "".join(lines[:at] + [n + "\n" for n in new] + lines[at:]).encode()


def test_pure_insertion_onto_a_revision_that_has_it_is_already_present(user_home):
    """The reported defect: onto a revision holding the entry plus another change to the same file, the
    insertion hunk matched its context again and went in twice, reported as `applied`."""
    home = user_home
    stock = fork_file(home, [], SHARED)
    with_x = _with_lines(stock, "shared slot 3", ["inserted_by_x = 1"])
    record_entry(home, "insert-x", prefixed_source(home, [], {SHARED: with_x}), requires=[], meta=DRAFT)
    fork = open_fork(home)
    prefix = fork.package_prefix
    rev = commit_files(fork.repo, fork.stock_commit, {prefix + SHARED: with_x.replace(b"shared slot 9\n", b"other\n")})
    result = apply_entries(home, ["insert-x"], onto=rev)
    assert [(o.id, o.status, o.present) for o in result.outcomes] == [("insert-x", PRESENT, [SHARED])]
    assert result.tree == fork.repo.rev_parse(f"{rev}^{{tree}}")


def test_some_hunks_already_there_are_named_and_not_repeated(user_home):
    home = user_home
    stock = fork_file(home, [], SHARED)
    two = _with_lines(_with_lines(stock, "shared slot 2", ["first = 1"]), "shared slot 10", ["second = 2"])
    record_entry(home, "two-hunks", prefixed_source(home, [], {SHARED: two}), requires=[], meta=DRAFT)
    fork = open_fork(home)
    prefix = fork.package_prefix
    has_first = _with_lines(stock, "shared slot 2", ["first = 1"]).replace(b"shared slot 6\n", b"mine\n")
    rev = commit_files(fork.repo, fork.stock_commit, {prefix + SHARED: has_first})
    result = apply_entries(home, ["two-hunks"], onto=rev, branch="deploy/partly")
    outcome = result.outcomes[0]
    assert (outcome.status, outcome.present, outcome.paths) == (PARTLY, [f"{SHARED}: hunk 1"], [SHARED])
    text = fork.repo.git("cat-file", "blob", f"deploy/partly:{prefix}{SHARED}").stdout
    assert text.count(b"first = 1\n") == 1 and text.count(b"second = 2\n") == 1 and b"mine\n" in text
    assert apply_entries(home, ["two-hunks"]).outcomes[0].status == APPLIED  # onto stock: as recorded


def test_apply_hunks_leaves_a_present_insertion_alone():
    delta = (
        b"diff --git a/f b/f\nindex " + b"1" * 40 + b".." + b"2" * 40 + b" 100644\n--- a/f\n+++ b/f\n"
        b"@@ -1,2 +1,3 @@\n one\n+two\n three\n"
    )
    hunks = parse_delta(delta, "e", "d").changes[0].hunks
    assert apply_hunks(b"one\nthree\n", hunks) == (b"one\ntwo\nthree\n", ())
    assert apply_hunks(b"one\ntwo\nthree\nfour\n", hunks) == (b"one\ntwo\nthree\nfour\n", (1,))


# -- the property: the in-memory application agrees with `git apply --3way` on every outcome ---------------


def _random_case(rng: random.Random) -> tuple[bytes, bytes, bytes]:
    """(pre, post, now): a file with repeated lines, an entry's edits to it, and a base that has some of
    those edits (or none), edits of its own elsewhere or on the same lines, so every outcome occurs."""
    size = rng.randint(4, 30)
    pre = [rng.choice(["", "pass", "}"]) if rng.random() < 0.2 else f"line {i}" for i in range(size)]

    def random_edits(count: int, tag: str, taken: list[tuple[int, int]], gap: int) -> list[tuple[int, int, list[str]]]:
        edits = []
        for _ in range(count):
            at = rng.randint(0, size)
            removed = rng.randint(0, 2) if at < size else 0
            new = [f"{tag}{rng.randint(0, 99)}" for _ in range(rng.randint(0 if removed else 1, 2))]
            if all(at + removed + gap <= lo or hi + gap <= at for lo, hi in taken):
                taken.append((at, at + removed))
                edits.append((at, removed, new))
        return edits

    def edited(edits) -> list[str]:
        lines = list(pre)
        for at, removed, new in sorted(edits, key=lambda e: e[0], reverse=True):
            lines[at : at + removed] = new
        return lines

    entry_edits = random_edits(rng.randint(1, 3), "E", [], 1)
    kept = [e for e in entry_edits if rng.random() < 0.5]
    own = random_edits(rng.randint(0, 2), "O", [(a, a + r) for a, r, _ in kept], rng.choice([0, 1, 4]))

    def text(lines: list[str]) -> bytes:
        return "".join(line + "\n" for line in lines).encode()

    return text(pre), text(edited(entry_edits)), text(edited(kept + own))


@pytest.fixture(scope="module")
def plain_resolver(user_home):
    return Resolver(open_fork(user_home), records={})


@settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32 - 1))
def test_in_memory_apply_agrees_with_git_apply_3way(plain_resolver, seed):
    pre, post, now = _random_case(random.Random(seed))
    repo = plain_resolver.repo
    pre_commit, post_commit = commit_files(repo, EMPTY_TREE, {"f": pre}), commit_files(repo, EMPTY_TREE, {"f": post})
    patch = repo.git("diff-tree", "-p", "--binary", "--full-index", pre_commit, post_commit).stdout
    change = parse_delta(patch, "e", "f.patch").changes[0]
    now_oid = repo.write_blob(now)
    with repo.temporary_index() as env:
        repo.git("update-index", "--add", "--cacheinfo", f"100644,{now_oid},f", env=env)
        git = repo.git("apply", "--3way", "--cached", "-", input=patch, env=env, check=False)
        git_oid = repo.out("ls-files", "-s", "f", env=env).split()[1] if git.returncode == 0 else None
    entry, how, present = plain_resolver.apply_file(change, ("100644", now_oid))
    if git_oid is None:
        assert how == "conflict"
    elif git_oid == now_oid:
        assert (how, entry) == ("present", UNCHANGED)
    else:
        assert entry == ("100644", git_oid), (pre, post, now)
        assert how != "present" and bool(present) == (how == "partly present")
