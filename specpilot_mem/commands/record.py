"""``specpilot-mem record ID --from REV_OR_WORKTREE``: turn a fork commit or work tree into an entry.

``specpilot-mem record ID... --src``: re-record SGLang entries from their sources (``entries/<id>/src/`` whole
files, ``patches/`` over their requirements) and the current kernel library (after a source or kernel change
or an evidence edit), keeping their requirements and metadata; several ids are one change, in requirement
order (how a dependent's conflict with its re-recorded requirement is resolved)."""

from __future__ import annotations

from specpilot_mem.home import find_home
from specpilot_mem.output import console, emit, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "record",
        parents=[common],
        help="record an entry from a fork commit or work tree",
        description=__doc__ + "\n\nThe source must be built on stock with its requirements "
        "applied (e.g. `apply A B --worktree PATH`, then edit). Re-recording an existing "
        "entry rebases every entry that requires it and runs their checks on other SGLang releases again.",
    )
    parser.add_argument("ids", nargs="+", metavar="ID", help="the entry (with --src: one or more)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--from",
        dest="source",
        metavar="REV_OR_WORKTREE",
        help="a fork revision, or a work tree of the fork (uncommitted changes included)",
    )
    source.add_argument(
        "--src",
        action="store_true",
        help="rebuild from entries/ID/src/ and patches/ over its requirements, re-vendoring its kernel folders "
        "from kernels/specpilot_kernels/ (record YAML edits such as new evidence first)",
    )
    parser.add_argument("--requires", metavar="A,B", help="comma-separated entry ids (default: the existing record's)")
    parser.add_argument(
        "--meta",
        metavar="draft.yaml",
        help="title, summary, contract, options, variants, evidence ... (needed for a new entry)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem.errors import SpecPilotError
    from specpilot_mem.sglang.entry_src import rebuild_entry
    from specpilot_mem.store import record_entry
    from specpilot_mem.store.sources import has_sources

    home = find_home(args.home)
    from specpilot_mem.store import load_entries

    old = load_entries(home)
    before = {i: r.reproduces for i, r in old.items()}
    if args.src:
        if args.requires is not None or args.meta is not None:
            raise SpecPilotError(
                "--src keeps the record's requirements and metadata",
                where="record --src",
                fix="edit entries/<id>/entry.yaml, then run record ID --src alone",
            )
        records = rebuild_entry(home, *args.ids)
    else:
        if len(args.ids) > 1:
            raise SpecPilotError(
                "--from records one entry",
                where="record " + " ".join(args.ids),
                fix="record them one by one, or rebuild several from their sources with --src",
            )
        requires = None if args.requires is None else [r.strip() for r in args.requires.split(",") if r.strip()]
        records = [record_entry(home, args.ids[0], args.source, requires=requires, meta=args.meta)]

    # the entries that require it were rebased onto it (store.record): say which
    after = load_entries(home)
    ids = {r.id for r in records}
    rebased = sorted(i for i, r in after.items() if i not in ids and before.get(i) not in (None, r.reproduces))
    # release checks are run again on the new records; one whose release could not be imported is dropped
    dropped = sorted(
        {
            c.release
            for i, r in old.items()
            for c in r.releases
            if i in after and after[i].release_check(c.release) is None
        }
    )

    def render(data) -> None:
        for entry in data["entries"]:
            console.print(
                table(
                    f"recorded {entry['id']}",
                    ["field", "value"],
                    [
                        ("title", entry["title"]),
                        ("requires", ", ".join(entry["requires"]) or "-"),
                        ("reproduces", entry["reproduces"]),
                        ("source", (entry["source"] or {}).get("commit") or ("sources" if args.src else "work tree")),
                        ("kernels", len(entry["kernels"])),
                        (
                            "files",
                            f"entries/{entry['id']}/entry.yaml, delta.patch"
                            + (", src/, patches/" if entry["id"] in data["sources"] else ""),
                        ),
                        (
                            "releases",
                            ", ".join(f"{c['release']} {c['verdict']}" for c in entry["releases"]) or "-",
                        ),
                    ],
                )
            )
        console.print(
            "rebased: "
            + (
                ", ".join(data["rebased"])
                + " (their evidence is marked: base changed, re-validate; sources re-rendered)"
                if data["rebased"]
                else "-"
            )
        )
        for version in data["dropped_releases"]:
            console.print(f"dropped: the checks on {version}: run `specpilot-mem revalidate --release {version}`")

    entries = [r.model_dump(mode="json") for r in records]
    payload = {
        **(entries[0] if len(entries) == 1 else {}),
        "entries": entries,
        "sources": sorted(i for i in ids | set(rebased) if has_sources(home, i)),
        "rebased": rebased,
        "dropped_releases": dropped,
    }
    emit(args, payload, render)
    return 0
