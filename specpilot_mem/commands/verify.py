"""``specpilot-mem verify``: rebuild every entry's chain from stock and compare with its record."""

from __future__ import annotations

from specpilot_mem.home import find_home
from specpilot_mem.output import console, emit, progress, styled, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "verify", parents=[common], help="check that every entry reproduces", description=__doc__
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem.store.records import load_entries
    from specpilot_mem.store.verify import verify_memory

    home = find_home(args.home)
    with progress("verifying entries", len(load_entries(home)), enabled=not args.json) as bar:
        checks = verify_memory(home, on_progress=bar.advance)
    payload = {
        "ok": all(c.ok for c in checks),
        "entries": [
            {
                "id": c.id,
                "ok": c.ok,
                "reproduces": c.reproduces,
                "tree": c.tree,
                "problem": c.problem,
                "branch": c.branch,
                "sources": c.sources,
                "kernels": [
                    {
                        "vendored": k.vendored,
                        "library": k.library,
                        "pinned": k.pinned,
                        "current": k.current,
                        "status": k.status,
                    }
                    for k in c.kernels
                ],
            }
            for c in checks
        ],
    }

    def render(data) -> None:
        rows = []
        for e in data["entries"]:
            behind = [
                k["vendored"].rsplit("/", 2)[-2] + "/" + k["vendored"].rsplit("/", 1)[-1]
                for k in e["kernels"]
                if k["status"] != "current"
            ]
            rows.append(
                (
                    e["id"],
                    "ok" if e["ok"] else "FAIL",
                    e["branch"],
                    ("behind: " + ", ".join(behind))
                    if behind
                    else (f"{len(e['kernels'])} current" if e["kernels"] else "-"),
                    e["sources"] or "-",
                    e["problem"],
                )
            )
        console.print(table("verify", ["entry", "reproduces", "branch", "kernels", "sources", "problem"], rows))
        console.print("all entries reproduce" if data["ok"] else styled("some entries do not reproduce", "bold red"))
        due = [e["id"] for e in data["entries"] if e["sources"] and e["sources"] != "current"]
        if due:
            console.print(
                styled(f"sources not current: {', '.join(due)}", "yellow")
                + " (record edited sources with `specpilot-mem record ID... --src`; "
                "rewrite the layout with `specpilot-mem sources`)"
            )

    emit(args, payload, render)
    return 0 if payload["ok"] else 1
