"""``specpilot-mem registry sync|rebuild``: keep ``registry.duckdb`` in step with the records.

``sync`` re-indexes only the record files whose content hash changed (added, changed, removed);
``rebuild`` starts from an empty database. Both build a new file and rename it into place, so readers
never see half an index. Commands that read the registry sync it themselves; these are for scripts,
CI and after a ``git pull``.
"""

from __future__ import annotations

from dataclasses import asdict

from specpilot_mem.output import console, emit, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "registry", parents=[common], help="sync or rebuild registry.duckdb", description=__doc__
    )
    verbs = parser.add_subparsers(dest="registry_command", metavar="sync|rebuild", required=True)
    verbs.add_parser("sync", parents=[common], help="re-index the records that changed").set_defaults(
        func=run, rebuild=False
    )
    verbs.add_parser("rebuild", parents=[common], help="re-index every record from scratch").set_defaults(
        func=run, rebuild=True
    )


def run(args) -> int:
    from specpilot_mem.home import find_home
    from specpilot_mem.registry.sync import sync

    home = find_home(args.home)
    report = sync(home, rebuild=args.rebuild, show_progress=not args.json)
    payload = {"registry": str(home.registry), **asdict(report), "wrote": report.wrote}

    def render(data) -> None:
        if not data["wrote"]:
            console.print(f"registry up to date ({data['records']} records, {data['seconds'] * 1000:.0f} ms)")
            return
        rows = [
            (kind, len(data[kind]), ", ".join(data[kind][:5]) + (" ..." if len(data[kind]) > 5 else ""))
            for kind in ("added", "changed", "removed")
        ]
        how = f"rebuilt ({data['reason']})" if data["rebuilt"] else "synced"
        console.print(
            table(f"registry {how}: {data['records']} records in {data['seconds']:.2f} s", ["", "files", "paths"], rows)
        )

    emit(args, payload, render)
    return 0
