"""The store on the real pinned stock: init, record, apply, verify, branches, updates."""

from __future__ import annotations

import pytest
from test_store_support import DRAFT, append_line, commit_files, source_on

from specpilot_mem.errors import ConflictError, ForkError, ReproductionError
from specpilot_mem.models import Evidence, Variant
from specpilot_mem.store import add_evidence, add_variant, init_memory, load_entries, record_entry
from specpilot_mem.store import stock as stock_import
from specpilot_mem.store.fork import open_fork
from specpilot_mem.store.resolver import APPLIED, CONFLICT, EMPTY, PRESENT, apply_entries
from specpilot_mem.store.verify import verify_memory

SERVER_ARGS = "sglang/srt/server_args.py"
README = "sglang/README.md"


def test_init_gives_the_pinned_stock_and_is_idempotent(stock_fork_home):
    fork = open_fork(stock_fork_home)
    assert (fork.stock_commit, fork.stock_tree) == (stock_import.STOCK_COMMIT, stock_import.STOCK_TREE)
    files = fork.repo.out("ls-tree", "-r", "--name-only", "stock").splitlines()
    assert len(files) == 5768 and not [f for f in files if f.endswith(".so") or ".dist-info" in f]
    assert fork.repo.out("cat-file", "blob", "stock:.gitattributes") == "* -text"
    excluded = stock_import.excluded_files(fork.repo, fork.stock_commit)
    assert sum(r.path.endswith(".so") for r in excluded) == 5
    refs_before = fork.repo.refs("refs")
    again = init_memory(stock_fork_home)
    assert not again.built and fork.repo.refs("refs") == refs_before


def test_record_then_apply_reproduces_and_builds_branches(stock_home_copy):
    home = stock_home_copy
    alpha = record_entry(
        home,
        "alpha",
        source_on(home, [], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# alpha")}),
        requires=[],
        meta=DRAFT,
    )
    beta_src = source_on(
        home,
        ["alpha"],
        {
            SERVER_ARGS: append_line(home, SERVER_ARGS, "# beta", ["alpha"]),
            "sglang/srt/specpilot/beta.py": b"BETA = 1\n",
            README: None,
        },
    )
    beta = record_entry(home, "beta", beta_src, requires=["alpha"], meta=DRAFT)
    fork = open_fork(home)
    assert beta.reproduces == fork.repo.rev_parse(f"{beta_src}^{{tree}}") and beta.source.commit == beta_src
    result = apply_entries(home, ["beta"])
    assert result.order == ["alpha", "beta"]
    assert [(o.id, o.status, o.reproduced) for o in result.outcomes] == [
        ("alpha", APPLIED, True),
        ("beta", APPLIED, True),
    ]
    assert result.tree == beta.reproduces
    tip = fork.repo.rev_parse("entry/beta")
    assert fork.repo.rev_parse(f"{tip}^{{tree}}") == beta.reproduces
    assert fork.repo.rev_parse(f"{tip}^") != fork.stock_commit  # base = merge of stock and alpha's tip
    assert fork.repo.out("rev-list", "--parents", "-n1", f"{tip}^").split()[1:] == [
        fork.stock_commit,
        fork.repo.rev_parse("entry/alpha"),
    ]
    assert fork.repo.rev_parse("entry/alpha^{tree}") == alpha.reproduces
    # a second init, and a fresh resolver, change nothing
    refs = fork.repo.refs("refs/heads")
    init_memory(home)
    assert fork.repo.refs("refs/heads") == refs
    assert all(c.ok and c.branch == "current" for c in verify_memory(home))


def test_statuses_merges_and_conflicts(stock_home_copy):
    home = stock_home_copy
    record_entry(home, "empty", source_on(home, [], {}), requires=[], meta=DRAFT)
    fork = open_fork(home)
    stock_text = fork.repo.git("cat-file", "blob", f"stock:{SERVER_ARGS}").stdout
    top = b"# top\n" + stock_text
    record_entry(home, "top", source_on(home, [], {SERVER_ARGS: top}), requires=[], meta=DRAFT)
    record_entry(
        home, "bottom", source_on(home, [], {SERVER_ARGS: stock_text + b"# bottom\n"}), requires=[], meta=DRAFT
    )
    # rewrites the first line, which top's hunk has as context: neither a plain apply nor a 3-way merge works
    record_entry(
        home,
        "clash",
        source_on(home, [], {SERVER_ARGS: b"# clash\n" + stock_text.split(b"\n", 1)[1]}),
        requires=[],
        meta=DRAFT,
    )
    # inserts where top inserts: a conflict, as with `git apply --3way` (a hunk at line 1 must match at the top)
    record_entry(home, "above", source_on(home, [], {SERVER_ARGS: b"# above\n" + stock_text}), requires=[], meta=DRAFT)
    # inserts further down: the later hunk of "low" applies at an offset of one line
    lines = stock_text.splitlines(keepends=True)
    record_entry(
        home,
        "mid",
        source_on(home, [], {SERVER_ARGS: b"".join(lines[:10] + [b"# mid\n"] + lines[10:])}),
        requires=[],
        meta=DRAFT,
    )
    record_entry(
        home,
        "low",
        source_on(home, [], {SERVER_ARGS: b"".join(lines[:30] + [b"# low\n"] + lines[30:])}),
        requires=[],
        meta=DRAFT,
    )
    record_entry(home, "same-as-top", source_on(home, [], {SERVER_ARGS: top}), requires=[], meta=DRAFT)
    result = apply_entries(home, ["bottom", "empty", "top"], branch="deploy/merged")
    assert {o.id: o.status for o in result.outcomes} == {"bottom": APPLIED, "empty": EMPTY, "top": APPLIED}
    text = fork.repo.git("cat-file", "blob", f"deploy/merged:{SERVER_ARGS}").stdout
    assert text == b"# top\n" + stock_text + b"# bottom\n"
    assert [o.status for o in apply_entries(home, ["same-as-top", "top"]).outcomes] == [APPLIED, PRESENT]
    apply_entries(home, ["mid", "low"], branch="deploy/offset")
    assert fork.repo.git("cat-file", "blob", f"deploy/offset:{SERVER_ARGS}").stdout == b"".join(
        lines[:10] + [b"# mid\n"] + lines[10:30] + [b"# low\n"] + lines[30:]
    )
    clashing = apply_entries(home, ["above", "top"])  # onto stock, too, a conflict is data
    assert [(o.id, o.status, o.paths, o.conflicts_with) for o in clashing.outcomes] == [
        ("above", APPLIED, [SERVER_ARGS], []),
        ("top", CONFLICT, [SERVER_ARGS], ["above"]),
    ]
    refs = fork.repo.refs("refs")
    with pytest.raises(ConflictError) as err:
        apply_entries(home, ["clash", "top"], branch="deploy/x")
    assert "clash" in err.value.what and SERVER_ARGS in err.value.where
    assert fork.repo.refs("refs") == refs
    # onto another base a conflict is data
    other = commit_files(fork.repo, "stock", {SERVER_ARGS: b"# rewritten\n"})
    result = apply_entries(home, ["top", "empty"], onto=other)
    assert {o.id: o.status for o in result.outcomes} == {"top": CONFLICT, "empty": EMPTY}
    assert result.conflicts[0].paths == [SERVER_ARGS]


def test_branch_output_is_deterministic(stock_home_copy):
    home = stock_home_copy
    record_entry(home, "alpha", source_on(home, [], {README: b"patched\n"}), requires=[], meta=DRAFT)
    fork = open_fork(home)
    first = apply_entries(home, ["alpha"], branch="deploy/one")
    assert fork.repo.rev_parse("deploy/one") == first.commit
    assert fork.repo.out("cat-file", "blob", f"deploy/one:{README}") == "patched"
    assert apply_entries(home, ["alpha"], branch="deploy/one").commit == first.commit
    with pytest.raises(ForkError, match="already exists"):
        apply_entries(home, ["alpha"], onto=fork.repo.rev_parse("entry/alpha"), branch="deploy/one")


def test_updates_reverify_dependents(stock_home_copy, tmp_path):
    home = stock_home_copy
    record_entry(
        home,
        "alpha",
        source_on(home, [], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# alpha")}),
        requires=[],
        meta=DRAFT,
    )
    record_entry(
        home,
        "beta",
        source_on(home, ["alpha"], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# beta", ["alpha"])}),
        requires=["alpha"],
        meta=DRAFT,
    )
    variant = Variant(name="hopper", options={}, hardware=["sm_90"])
    assert add_variant(home, "alpha", variant).variants == [variant]
    evidence = Evidence.model_validate(
        {
            "kind": "microbenchmark",
            "deployment": {"gpu": "H200", "arch": "sm_90"},
            "command": "python benchmarks/x.py",
            "date": "2026-11-30",
            "synthetic": True,
        }
    )
    assert len(add_evidence(home, "alpha", evidence).evidence) == 1
    before = (home.entries / "alpha" / "delta.patch").read_bytes(), open_fork(home).repo.refs("refs")
    # re-recording alpha so that beta's delta no longer applies must be refused, changing nothing
    with pytest.raises((ReproductionError, ConflictError)):
        record_entry(home, "alpha", source_on(home, [], {SERVER_ARGS: append_line(home, SERVER_ARGS, "# other")}))
    assert ((home.entries / "alpha" / "delta.patch").read_bytes(), open_fork(home).repo.refs("refs")) == before
    assert load_entries(home)["alpha"].variants == [variant]


def test_crlf_files_round_trip_and_merge(stock_home_copy):
    """13 stock files have CRLF endings: deltas and in-process hunk application keep the \\r bytes."""
    home = stock_home_copy
    path = "sglang/multimodal_gen/configs/models/dits/hunyuan_image3.py"
    fork = open_fork(home)
    original = fork.repo.git("cat-file", "blob", f"stock:{path}").stdout
    assert b"\r\n" in original
    lines = original.split(b"\r\n")
    top = b"\r\n".join([b"# top"] + lines)
    bottom = original + b"# bottom\r\n"
    record_entry(home, "crlf-top", source_on(home, [], {path: top}), requires=[], meta=DRAFT)
    record_entry(home, "crlf-bottom", source_on(home, [], {path: bottom}), requires=[], meta=DRAFT)
    apply_entries(home, ["crlf-top", "crlf-bottom"], branch="deploy/crlf")
    assert fork.repo.git("cat-file", "blob", f"deploy/crlf:{path}").stdout == b"# top\r\n" + original + b"# bottom\r\n"
