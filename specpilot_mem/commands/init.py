"""``specpilot-mem init``: build the SGLang fork from the pinned wheel (or your fork) and the entry branches."""

from __future__ import annotations

import time

from specpilot_mem.home import find_home
from specpilot_mem.output import console, emit, progress, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "init", parents=[common], help="build sglang-fork (stock + entry branches)", description=__doc__
    )
    parser.add_argument("--wheel", metavar="PATH", help="use this sglang wheel file instead of the download cache")
    parser.add_argument("--fork-url", metavar="URL|PATH", help="your own SGLang fork instead of the pinned wheel")
    parser.add_argument("--stock-rev", metavar="REV", help="with --fork-url: the revision that is your stock")
    parser.add_argument(
        "--package-prefix", metavar="DIR", default="", help="with --fork-url: the folder holding sglang/ (e.g. python/)"
    )
    parser.add_argument(
        "--no-checkout",
        action="store_true",
        help="leave the fork's work tree empty (faster; the resolver never needs it)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem.store import init_memory

    home = find_home(args.home)
    started = time.perf_counter()
    with progress("importing stock from the SGLang wheel", None, enabled=not args.json) as bar:
        result = init_memory(
            home,
            wheel=args.wheel,
            fork_url=args.fork_url,
            stock_rev=args.stock_rev,
            package_prefix=args.package_prefix,
            checkout=not args.no_checkout,
            progress=lambda done, total: bar.update(completed=done, total=total),
        )
    fork = result.fork
    payload = {
        "fork": str(fork.repo.path),
        "built": result.built,
        "stock_commit": fork.stock_commit,
        "stock_tree": fork.stock_tree,
        "pinned": fork.pinned,
        "package_prefix": fork.package_prefix,
        "gitlink": result.gitlink,
        "wheel": result.wheel,
        "seconds": round(time.perf_counter() - started, 2),
        "branches": [
            {"id": b.id, "ref": b.ref, "commit": b.commit, "change": b.change, "problem": b.problem}
            for b in result.branches
        ],
    }

    def render(data) -> None:
        console.print(f"fork {data['fork']} ({'built' if data['built'] else 'already there'}) in {data['seconds']} s")
        console.print(
            f"stock {data['stock_commit']} tree {data['stock_tree']}"
            f" ({'pinned SGLang wheel' if data['pinned'] else 'your fork'}); project gitlink: {data['gitlink']}"
        )
        if data["wheel"]:
            console.print(f"wheel {data['wheel']}")
        if data["branches"]:
            console.print(
                table(
                    "entry branches",
                    ["entry", "commit", "change", "problem"],
                    [(b["id"], (b["commit"] or "")[:12], b["change"], b["problem"]) for b in data["branches"]],
                )
            )
        else:
            console.print("no entries recorded yet")

    emit(args, payload, render)
    return 1 if result.failed else 0
