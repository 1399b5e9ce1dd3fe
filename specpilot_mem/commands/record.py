"""``specpilot-mem record ID --from REV_OR_WORKTREE``: turn a fork commit or work tree into an entry.

``specpilot-mem record ID --src``: re-record an SGLang entry from ``entries/<id>/src/`` and the current
kernel library (after a kernel change or an evidence edit), keeping its requirements and metadata."""

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
    parser.add_argument("id", metavar="ID")
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
        help="rebuild from entries/ID/src/ over its requirements, re-vendoring its kernel folders "
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
        record = rebuild_entry(home, args.id)
    else:
        requires = None if args.requires is None else [r.strip() for r in args.requires.split(",") if r.strip()]
        record = record_entry(home, args.id, args.source, requires=requires, meta=args.meta)

    # the entries that require it were rebased onto it (store.record): say which
    after = load_entries(home)
    rebased = sorted(i for i, r in after.items() if i != record.id and before.get(i) not in (None, r.reproduces))
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
        console.print(
            table(
                f"recorded {data['id']}",
                ["field", "value"],
                [
                    ("title", data["title"]),
                    ("requires", ", ".join(data["requires"]) or "-"),
                    ("reproduces", data["reproduces"]),
                    ("source", (data["source"] or {}).get("commit") or "work tree"),
                    ("kernels", len(data["kernels"])),
                    ("files", f"entries/{data['id']}/entry.yaml, delta.patch"),
                    (
                        "rebased",
                        ", ".join(data["rebased"]) + " (their evidence is marked: base changed, re-validate)"
                        if data["rebased"]
                        else "-",
                    ),
                    (
                        "releases",
                        ", ".join(f"{c['release']} {c['verdict']}" for c in data["releases"]) or "-",
                    ),
                ]
                + [
                    ("dropped", f"the checks on {v}: run `specpilot-mem revalidate --release {v}`")
                    for v in data["dropped_releases"]
                ],
            )
        )

    emit(args, {**record.model_dump(mode="json"), "rebased": rebased, "dropped_releases": dropped}, render)
    return 0
