"""``specpilot-mem port ID... --onto sglang==X|WHEEL``: a ported variant of entries for another SGLang release.

Where an entry's 3-way merge onto the release is clean (verdict clean or drift, its requirements applying
too), its merged result is written as ``entries/<id>/ports/sglang-<X>.patch`` and recorded in the entry's
``releases`` as a port (source release, target release, the tree it gives there) whose status stays
``candidate`` until it is re-measured. An entry that conflicts, is blocked or is already upstream is
refused, and then nothing is written.
"""

from __future__ import annotations

from specpilot_mem.output import console, emit, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "port", parents=[common], help="write ported entry variants for another SGLang release", description=__doc__
    )
    parser.add_argument("ids", nargs="+", metavar="ID", help="entry ids (their requirements must apply there too)")
    parser.add_argument(
        "--onto", required=True, metavar="sglang==X|WHEEL", help="the release: a pinned version or a wheel's path"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem.home import find_home
    from specpilot_mem.store.port import port_entries
    from specpilot_mem.store.releases import ReleaseError, is_release_spec

    if not is_release_spec(args.onto):
        raise ReleaseError(
            f"--onto {args.onto!r} names no SGLang release",
            where="--onto",
            fix="pass sglang==X (a pinned release) or the path of an SGLang wheel",
        )
    home = find_home(args.home)
    base, ported = port_entries(home, args.ids, args.onto)
    payload = {
        "release": base.to_dict(),
        "entries": [
            {
                "id": v.id,
                "verdict": v.verdict,
                "already_ported": v.port_reproduces is None,
                "reproduces": v.port_reproduces,
                "changed": v.changed,
                "delta": f"entries/{v.id}/ports/sglang-{base.version}.patch",
            }
            for v in ported
        ],
    }

    def render(data) -> None:
        rows = [
            (
                e["id"],
                e["verdict"],
                "already ported" if e["already_ported"] else e["delta"],
                ", ".join(e["changed"]) or "-",
            )
            for e in data["entries"]
        ]
        console.print(
            table(
                f"ported onto SGLang {data['release']['version']} (status candidate: re-validation pending)",
                ["entry", "3-way merge", "ported delta", "files changed upstream"],
                rows,
            )
        )

    emit(args, payload, render)
    return 0
