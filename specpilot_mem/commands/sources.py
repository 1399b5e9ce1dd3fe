"""``specpilot-mem sources [ID...]``: write entries' sources from their recorded deltas, one copy of each file.

Each file an entry changes is kept once: whole under ``entries/<id>/src/`` where no requirement changes it,
as the entry's own patch over the requirements under ``entries/<id>/patches/<path>.patch`` where one does
(``specpilot_mem.store.sources``). This is the migration from whole copies (run it once after merging) and the
repair of sources edited by hand; idempotent, all or nothing (every entry must reproduce and its present
sources must describe its delta, or nothing is written). ``--check`` writes nothing and exits 1 when a
rewrite is due.
"""

from __future__ import annotations

from specpilot_mem.home import find_home
from specpilot_mem.output import console, emit, styled, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "sources", parents=[common], help="write entries' src/ and patches/ from their deltas", description=__doc__
    )
    parser.add_argument("ids", nargs="*", metavar="ID", help="entries to write (default: every entry with sources)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if some sources would change")
    parser.set_defaults(func=run)


def run(args) -> int:
    from dataclasses import asdict

    from specpilot_mem.store.sources import write_entry_sources

    home = find_home(args.home)
    reports = write_entry_sources(home, args.ids or None, check=args.check)
    payload = {
        "check": args.check,
        "changed": [r.id for r in reports if r.status != "current"],
        "entries": [asdict(r) for r in reports],
    }

    def render(data) -> None:
        rows = [
            (
                e["id"],
                e["status"] if e["status"] == "current" else styled(e["status"], "bold"),
                len(e["whole"]),
                len(e["patches"]),
                ", ".join(e["converted"]) or "-",
                ", ".join(e["removed"]) or "-",
            )
            for e in data["entries"]
        ]
        console.print(
            table("sources", ["entry", "status", "whole files", "patches", "whole copy -> patch", "removed"], rows)
        )
        changed = data["changed"]
        verb = "would rewrite" if data["check"] else "rewrote"
        console.print(
            f"{verb} {len(changed)} of {len(rows)} entries: {', '.join(changed)}" if changed else "all sources current"
        )

    emit(args, payload, render)
    return 1 if args.check and payload["changed"] else 0
