"""``specpilot-mem browse``: the memory as a static site, or served on localhost.

Writes the entries (status, scope, options, contract, limits, untested regimes, evidence drawn as plots),
the requirement DAG, every entry's status per SGLang release and a query form over the registry into
``--out`` (default ``.specpilot/site``), every link relative, so the folder can be opened from disk or
published as it is. ``--serve`` then serves it on 127.0.0.1 until interrupted.
"""

from __future__ import annotations

from specpilot_mem.output import console, emit


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "browse", parents=[common], help="write (or serve) the memory browser", description=__doc__
    )
    parser.add_argument("--out", metavar="DIR", help="where to write the site (default: <home>/.specpilot/site)")
    parser.add_argument("--serve", action="store_true", help="serve the site on localhost after building it")
    parser.add_argument("--port", type=int, default=8765, help="with --serve (0 picks a free port)")
    parser.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from specpilot_mem.browse.serve import serve
    from specpilot_mem.browse.site import build_site
    from specpilot_mem.home import find_home

    home = find_home(args.home)
    out = Path(args.out) if args.out else home.state / "site"
    report = build_site(home, out)
    payload = {
        "out": str(report.out),
        "index": str(report.out / "index.html"),
        "entries": report.entries,
        "pages": len(report.pages),
        "plots": report.plots,
        "seconds": round(report.seconds, 3),
    }
    emit(
        args,
        payload,
        lambda d: console.print(
            f"wrote {d['pages']} pages ({d['entries']} entries, {d['plots']} plots) to {d['out']} in {d['seconds']:.2f} s; "
            f"open {d['index']}"
        ),
    )
    if args.serve:
        serve(report.out, args.port, lambda url: console.print(f"serving {url} (Ctrl-C stops)"))
    return 0
