"""``specpilot-mem apply ID... --onto stock|REV``: entries with their requirements onto a base, checked."""

from __future__ import annotations

from specpilot_mem.home import find_home
from specpilot_mem.output import console, emit, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser("apply", parents=[common], help="apply entries (with requirements) onto a base",
                                   description=__doc__)
    parser.add_argument("ids", nargs="*", metavar="ID", help="entry ids")
    parser.add_argument("--all", action="store_true", help="every recorded entry")
    parser.add_argument("--onto", default="stock", metavar="stock|REV", help="base: stock (default) or a fork revision")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--branch", metavar="deploy/NAME", help="write the result as this fork branch")
    target.add_argument("--worktree", metavar="PATH", help="check the result out in this (new or clean) work tree")
    target.add_argument("--export", metavar="DIR", help="write an importable sglang package here")
    parser.add_argument("--force", action="store_true", help="with --branch: move an existing branch")
    parser.set_defaults(func=run)


def payload_of(result) -> dict:
    return {
        "requested": result.requested, "order": result.order, "onto": result.onto, "onto_commit": result.onto_commit,
        "tree": result.tree, "commit": result.commit, "branch": result.branch, "worktree": result.worktree,
        "export": result.export,
        "entries": [{"id": o.id, "status": o.status, "paths": o.paths, "conflicts_with": o.conflicts_with,
                     "reproduces": o.reproduces, "tree": o.tree, "reproduced": o.reproduced} for o in result.outcomes],
    }


def run(args) -> int:
    from specpilot_mem.store.resolver import apply_entries

    from specpilot_mem.store import load_entries

    home = find_home(args.home)
    ids = list(load_entries(home)) if args.all else args.ids
    result = apply_entries(home, ids, onto=args.onto, branch=args.branch, worktree=args.worktree,
                           export=args.export, force=args.force)

    def render(data) -> None:
        rows = []
        for e in data["entries"]:
            check = {True: "yes", False: "NO", None: "-"}[e["reproduced"]]
            files = f"{len(e['paths'])}: {e['paths'][0]}" + (" ..." if len(e["paths"]) > 1 else "") if e["paths"] else "-"
            rows.append((e["id"], e["status"], check, files, ", ".join(e["conflicts_with"])))
        console.print(table(f"apply onto {data['onto']} ({data['onto_commit'][:12]})",
                            ["entry", "status", "reproduces", "files", "conflicts with"], rows))
        console.print(f"result tree {data['tree']}")
        for key in ("branch", "worktree"):
            if data[key]:
                console.print(f"{key}: {data[key]} at {data['commit'][:12]}")
        if data["export"]:
            console.print(f"exported to {args.export}")

    emit(args, payload_of(result), render)
    return 1 if result.conflicts else 0
