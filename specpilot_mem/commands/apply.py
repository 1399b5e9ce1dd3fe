"""``specpilot-mem apply ID... --onto stock|REV|sglang==X|WHEEL``: entries with their requirements onto a base, checked.

Onto another SGLang release (``sglang==0.5.20``, or the path of an SGLang wheel) the release is imported
beside stock as ``release/<version>`` (the same commit on every machine) and each entry gets a verdict:
clean, drift (applies, but files it touches changed upstream), conflict (with paths and hunks), superseded
(upstream has it) or blocked (a requirement does not apply). Conflicts are reported, not raised.
"""

from __future__ import annotations

from specpilot_mem.home import find_home
from specpilot_mem.output import assemble, console, emit, styled, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "apply", parents=[common], help="apply entries (with requirements) onto a base", description=__doc__
    )
    parser.add_argument("ids", nargs="*", metavar="ID", help="entry ids")
    parser.add_argument("--all", action="store_true", help="every recorded entry")
    parser.add_argument(
        "--onto",
        default="stock",
        metavar="stock|REV|sglang==X|WHEEL",
        help="base: stock (default), a fork revision, a pinned SGLang release or an SGLang wheel's path",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--branch", metavar="deploy/NAME", help="write the result as this fork branch")
    target.add_argument("--worktree", metavar="PATH", help="check the result out in this (new or clean) work tree")
    target.add_argument("--export", metavar="DIR", help="write an importable sglang package here")
    parser.add_argument("--force", action="store_true", help="with --branch: move an existing branch")
    parser.set_defaults(func=run)


def payload_of(result) -> dict:
    return {
        "requested": result.requested,
        "order": result.order,
        "onto": result.onto,
        "onto_commit": result.onto_commit,
        "tree": result.tree,
        "commit": result.commit,
        "branch": result.branch,
        "worktree": result.worktree,
        "export": result.export,
        "entries": [
            {
                "id": o.id,
                "status": o.status,
                "paths": o.paths,
                "conflicts_with": o.conflicts_with,
                "present": o.present,
                "reproduces": o.reproduces,
                "tree": o.tree,
                "reproduced": o.reproduced,
            }
            for o in result.outcomes
        ],
    }


def run(args) -> int:
    from specpilot_mem.store import load_entries
    from specpilot_mem.store.releases import is_release_spec
    from specpilot_mem.store.resolver import apply_entries

    from specpilot_mem.errors import SpecPilotError

    for option in ("branch", "worktree", "export"):
        if getattr(args, option) is not None and not getattr(args, option).strip():
            raise SpecPilotError(
                f"--{option} is empty",
                where=f"--{option}",
                fix=f"give --{option} a {'name' if option == 'branch' else 'path'}, or leave it out",
            )
    home = find_home(args.home)
    ids = list(load_entries(home)) if args.all else args.ids
    if is_release_spec(args.onto):
        return run_release(args, home, ids)
    result = apply_entries(
        home, ids, onto=args.onto, branch=args.branch, worktree=args.worktree, export=args.export, force=args.force
    )

    def render(data) -> None:
        rows = []
        for e in data["entries"]:
            check = {True: "yes", False: "NO", None: "-"}[e["reproduced"]]
            files = (
                f"{len(e['paths'])}: {e['paths'][0]}" + (" ..." if len(e["paths"]) > 1 else "") if e["paths"] else "-"
            )
            present = e["present"][:2] + ([f"+{len(e['present']) - 2} more"] if len(e["present"]) > 2 else [])
            status = e["status"] + (f" ({'; '.join(present)})" if e["status"] == "partly present" else "")
            rows.append((e["id"], status, check, files, ", ".join(e["conflicts_with"])))
        console.print(
            table(
                f"apply onto {data['onto']} ({data['onto_commit'][:12]})",
                ["entry", "status", "reproduces", "files", "conflicts with"],
                rows,
            )
        )
        console.print(f"result tree {data['tree']}")
        for key in ("branch", "worktree"):
            if data[key]:
                console.print(f"{key}: {data[key]} at {data['commit'][:12]}")
        if data["export"]:
            console.print(f"exported to {args.export}")

    emit(args, payload_of(result), render)
    return 1 if result.conflicts else 0


VERDICT_STYLE = {
    "clean": "green",
    "drift": "yellow",
    "conflict": "bold red",
    "superseded": "cyan",
    "blocked": "magenta",
}


def run_release(args, home, ids: list[str]) -> int:
    """The port check onto a release, then (when asked and nothing conflicts) the branch, worktree or export."""
    from specpilot_mem.errors import UnknownEntryError
    from specpilot_mem.store.port import check_release
    from specpilot_mem.store.resolver import apply_entries

    if not ids:
        raise UnknownEntryError("no entries to apply", where="apply", fix="name at least one entry id, or pass --all")
    report = check_release(home, args.onto, ids)
    payload = {
        "requested": ids,
        "onto": args.onto,
        "release": report.release.to_dict(),
        "counts": report.counts(),
        "entries": [v.to_dict() for v in report.entries],
    }
    blocked = [v for v in report.entries if v.verdict in ("conflict", "blocked")]
    if (args.branch or args.worktree or args.export) and not blocked:
        result = apply_entries(
            home, ids, onto=args.onto, branch=args.branch, worktree=args.worktree, export=args.export, force=args.force
        )
        payload.update(
            tree=result.tree, commit=result.commit, branch=result.branch, worktree=result.worktree, export=result.export
        )
    elif args.branch or args.worktree or args.export:
        payload["not_written"] = "the result has conflicts, so no branch, worktree or export was written"
    emit(args, payload, render_release)
    return 1 if blocked else 0


def render_release(data: dict) -> None:
    release = data["release"]
    rows = []
    for e in data["entries"]:
        details = []
        for f in e["files"]:
            if f["upstream"] == "unchanged" and f["how"] == "as recorded":
                continue
            line = f"{f['path']}: {f['how']}" + (f" ({f['reason']})" if f["reason"] else "")
            touched = [h for h in f["hunks"] if h["touched"]]
            line += "".join(f"\n    hunk {h['index']} {h['header']} {h['first_change'][:60]}" for h in touched[:4])
            details.append(line)
        if e["blocked_by"]:
            details.insert(0, f"requires {', '.join(e['blocked_by'])}, which do not apply")
        verdict = assemble((e["verdict"], VERDICT_STYLE[e["verdict"]]), " (port)" if e["ported"] else "")
        rows.append((e["id"], verdict, len(e["files"]), "\n".join(details) or "-"))
    title = f"onto SGLang {release['version']} ({release['ref']} {release['commit'][:12]})"
    result = table(title, ["entry", "verdict", "files", "what changed upstream"], rows)
    result.columns[3].overflow = "fold"
    console.print(result)
    console.print(", ".join(f"{k}: {v}" for k, v in sorted(data["counts"].items())))
    if data.get("not_written"):
        console.print(styled(data["not_written"], "bold red"))
    for key in ("branch", "worktree"):
        if data.get(key):
            console.print(f"{key}: {data[key]} at {data['commit'][:12]}")
    if data.get("export"):
        console.print("exported")
