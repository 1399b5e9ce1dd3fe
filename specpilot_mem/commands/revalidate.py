"""``specpilot-mem revalidate --release X``: the freshness pass of the memory on an SGLang release.

Runs the port check for every entry on the release (``sglang==X`` or a wheel's path, imported beside
stock), records each entry's verdict and status there (in ``releases`` of its record; on the entry's own
release, its ``status``), demotes to ``candidate`` what the check cannot confirm (drift, conflict,
blocked; a port until it is re-measured), marks ``superseded`` what upstream already has, and lists what
must be re-measured on which hardware. Clean entries keep their status. ``--dry-run`` writes nothing.
"""

from __future__ import annotations

from specpilot_mem.output import console, emit, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "revalidate",
        parents=[common],
        help="port-check every entry on a release, demote what fails",
        description=__doc__,
    )
    parser.add_argument("--release", required=True, metavar="X|sglang==X|WHEEL", help="the SGLang release, e.g. 0.5.20")
    parser.add_argument("--dry-run", action="store_true", help="report, write nothing")
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem.home import find_home
    from specpilot_mem.store.port import revalidate
    from specpilot_mem.store.releases import SPEC_PREFIX, is_release_spec

    spec = args.release if is_release_spec(args.release) else SPEC_PREFIX + args.release
    home = find_home(args.home)
    base, results = revalidate(home, spec, dry_run=args.dry_run)
    payload = {
        "release": base.to_dict(),
        "dry_run": args.dry_run,
        "entries": [
            {
                "id": r.id,
                "verdict": r.verdict.verdict,
                "before": r.before,
                "after": r.after,
                "demoted": r.demoted,
                "action": r.action,
                "changed": r.verdict.changed,
                "conflicts": r.verdict.conflicts,
                "blocked_by": r.verdict.blocked_by,
                "remeasure": r.remeasure,
            }
            for r in results
        ],
    }
    payload["remeasure"] = [{"entry": r.id, **item} for r in results for item in r.remeasure]

    def render(data) -> None:
        rows = [
            (
                e["id"],
                e["verdict"],
                f"{e['before'] or 'unchecked'} -> {e['after']}" + (" (demoted)" if e["demoted"] else ""),
                ", ".join(e["conflicts"] or e["changed"]) or "-",
                e["action"],
            )
            for e in data["entries"]
        ]
        console.print(
            table(
                f"SGLang {data['release']['version']}: status of every entry",
                ["entry", "verdict", "status", "files", "to do"],
                rows,
            )
        )
        if data["remeasure"]:
            where = [
                (
                    m["entry"],
                    m["gpu"] or "any GPU",
                    m["arch"],
                    m["regime"] or "-",
                    " / ".join(x for x in (m["target"], m["drafter"]) if x) or "-",
                    m["command"] or "-",
                )
                for m in data["remeasure"]
            ]
            console.print(
                table(
                    "to re-measure on the release",
                    ["entry", "GPU", "arch", "regime", "target / drafter", "command"],
                    where,
                )
            )
        console.print("dry run: nothing written" if data["dry_run"] else "records updated")

    emit(args, payload, render)
    return 0
