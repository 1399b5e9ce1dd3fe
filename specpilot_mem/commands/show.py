"""``specpilot-mem show ID|stock``: an entry's record, chain, delta and branch — or where stock came from."""

from __future__ import annotations

from specpilot_mem.home import find_home
from specpilot_mem.output import console, emit, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser("show", parents=[common], help="show an entry or stock", description=__doc__)
    parser.add_argument("id", metavar="ID|stock")
    parser.set_defaults(func=run)


def _stock(home) -> dict:
    from specpilot_mem.store import stock
    from specpilot_mem.store.fork import open_fork
    from specpilot_mem.store.init import project_gitlink

    fork = open_fork(home)
    excluded = stock.excluded_files(fork.repo, fork.stock_commit) if fork.pinned else []
    return {
        "stock_commit": fork.stock_commit,
        "stock_tree": fork.stock_tree,
        "pinned": fork.pinned,
        "source": (
            f"SGLang {stock.SGLANG_VERSION} wheel {stock.WHEEL_NAME} (sha256 {stock.WHEEL_SHA256})"
            if fork.pinned
            else fork.repo.config_get("remote.origin.url")
        ),
        "package_prefix": fork.package_prefix,
        "fork": str(fork.repo.path),
        "project_gitlink": project_gitlink(home),
        "files": int(fork.repo.out("ls-tree", "-r", "--name-only", "--full-tree", fork.stock_commit).count("\n")) + 1,
        "excluded": [{"path": r.path, "sha256": r.sha256, "size": r.size} for r in excluded],
    }


def _entry(home, entry_id: str) -> dict:
    from specpilot_mem.store.fork import open_fork
    from specpilot_mem.store.kernels import kernel_status
    from specpilot_mem.store.records import delta_path, load_entries
    from specpilot_mem.store.resolver import Resolver

    records = load_entries(home)
    fork = open_fork(home)
    resolver = Resolver(fork, records)
    chain = resolver.chain([entry_id])
    record = records[entry_id]
    delta = resolver.delta(entry_id)
    text = delta.text.decode(errors="replace").splitlines()
    return {
        "record": record.model_dump(mode="json"),
        "chain": chain,
        "required_by": sorted(i for i in records if i != entry_id and entry_id in resolver.closure([i])),
        "branch": fork.repo.rev_parse(fork.entry_ref(entry_id)),
        "delta": {
            "path": str(delta_path(home, entry_id).relative_to(home.root)),
            "sha256": delta.sha256,
            "files": [
                {"path": c.path, "change": "added" if c.added else "deleted" if c.deleted else "modified"}
                for c in delta.changes
            ],
            "added_lines": sum(1 for line in text if line.startswith("+") and not line.startswith("+++")),
            "removed_lines": sum(1 for line in text if line.startswith("-") and not line.startswith("---")),
        },
        "kernels": [{"vendored": k.vendored, "status": k.status} for k in kernel_status(home, record)],
    }


def run(args) -> int:
    home = find_home(args.home)
    if args.id == "stock":
        data = _stock(home)

        def render(d) -> None:
            console.print(
                table(
                    "stock",
                    ["field", "value"],
                    [
                        ("commit", d["stock_commit"]),
                        ("tree", d["stock_tree"]),
                        ("source", d["source"]),
                        ("package prefix", d["package_prefix"] or "(root)"),
                        ("files", d["files"]),
                        ("project gitlink", d["project_gitlink"] or "-"),
                        ("left out of the tree", f"{len(d['excluded'])} wheel files (compiled .so, dist-info)"),
                    ],
                )
            )

        emit(args, data, render)
        return 0
    data = _entry(home, args.id)

    def render(d) -> None:
        r = d["record"]
        scope = r["scope"]
        releases = ", ".join(
            f"{c['release']}: {c['status']} ({c['verdict']}{', port' if c['port'] else ''})" for c in r["releases"]
        )
        rows = [
            ("title", r["title"]),
            ("summary", r["summary"]),
            (
                "status",
                f"{r['status']} on SGLang {scope['sglang'] or '(no release in its scope)'}"
                + "".join(f"; {k} {', '.join(v)}" for k, v in scope.items() if k != "sglang" and v),
            ),
            ("other releases", releases or "-"),
            ("requires", ", ".join(r["requires"]) or "-"),
            ("chain", " -> ".join(d["chain"])),
            ("required by", ", ".join(d["required_by"]) or "-"),
            ("options", ", ".join(f"{o['name']}={o['default']}" for o in r["options"]) or "-"),
            ("variants", ", ".join(f"{v['name']} ({', '.join(v['hardware'])})" for v in r["variants"]) or "-"),
            ("contract", f"{r['contract']['level']}: {r['contract']['statement']}"),
            (
                "evidence",
                "; ".join(f"{e['kind']} on {e['deployment']['gpu']} {e['date']}" for e in r["evidence"]) or "-",
            ),
            ("reproduces", r["reproduces"]),
            ("branch", d["branch"] or "missing (run init)"),
            (
                "delta",
                f"{d['delta']['path']}: {len(d['delta']['files'])} files, "
                f"+{d['delta']['added_lines']} -{d['delta']['removed_lines']}",
            ),
            ("kernels", ", ".join(f"{k['vendored']} ({k['status']})" for k in d["kernels"]) or "-"),
        ]
        console.print(table(r["id"], ["field", "value"], rows))

    emit(args, data, render)
    return 0
