"""``specpilot-mem graph [ID...]``: the requirement graph, as text, Graphviz dot or a PNG picture."""

from __future__ import annotations

from pathlib import Path

from specpilot_mem.home import find_home
from specpilot_mem.optional import pyplot
from specpilot_mem.output import Text, console, emit


def register(subparsers, common) -> None:
    parser = subparsers.add_parser("graph", parents=[common], help="the requirement graph", description=__doc__)
    parser.add_argument("ids", nargs="*", metavar="ID", help="only these entries and their requirements")
    parser.add_argument("--format", choices=["text", "dot", "png"], default="text")
    parser.add_argument("--output", metavar="FILE", default="entry-graph.png", help="with --format png")
    parser.set_defaults(func=run)


def layers(order: list[str], requires: dict[str, list[str]]) -> dict[str, int]:
    """Depth of each entry: 0 for entries that require nothing, else 1 + its deepest requirement."""
    depth: dict[str, int] = {}
    for entry_id in order:
        depth[entry_id] = 1 + max((depth[r] for r in requires[entry_id]), default=-1)
    return depth


def to_dot(order: list[str], requires: dict[str, list[str]]) -> str:
    lines = ["digraph entries {", "  rankdir=BT;", '  node [shape=box, fontname="Helvetica"];', '  "stock" [shape=ellipse];']
    for entry_id in order:
        targets = requires[entry_id] or ["stock"]
        lines += [f'  "{entry_id}" -> "{t}";' for t in targets]
    return "\n".join(lines + ["}"]) + "\n"


def to_png(order: list[str], requires: dict[str, list[str]], path: Path) -> None:
    plt = pyplot("graph --png")

    depth = layers(order, requires)
    rows: dict[int, list[str]] = {}
    for entry_id in order:
        rows.setdefault(depth[entry_id], []).append(entry_id)
    pos = {"stock": (0.0, -1.0)}
    for level, members in rows.items():
        for n, entry_id in enumerate(members):
            pos[entry_id] = (n - (len(members) - 1) / 2, float(level))
    width = max([len(m) for m in rows.values()] + [1])
    fig, ax = plt.subplots(figsize=(max(4, 2.2 * width), 1.6 * (len(rows) + 1)))
    for entry_id in order:
        for target in requires[entry_id] or ["stock"]:
            (x0, y0), (x1, y1) = pos[entry_id], pos[target]
            ax.annotate("", xy=(x1, y1 + 0.12), xytext=(x0, y0 - 0.12),
                        arrowprops={"arrowstyle": "->", "color": "0.45"})
    for name, (x, y) in pos.items():
        ax.text(x, y, name, ha="center", va="center", fontsize=10,
                bbox={"boxstyle": "round", "fc": "#dde8f5" if name != "stock" else "#eeeeee", "ec": "0.3"})
    ax.set_xlim(-width / 2 - 0.5, width / 2 + 0.5)
    ax.set_ylim(-1.6, len(rows) - 0.4)
    ax.axis("off")
    ax.set_title("entry requirements (arrow: requires)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    from specpilot_mem.store.records import load_entries
    from specpilot_mem.store.requirements import chain

    home = find_home(args.home)
    records = load_entries(home)
    ids = chain(records, args.ids or list(records), home)
    requires = {i: records[i].requires for i in ids}
    payload = {"entries": [{"id": i, "requires": requires[i], "depth": d} for i, d in layers(ids, requires).items()]}
    if args.format == "png":
        out = Path(args.output)
        to_png(ids, requires, out)
        payload["png"] = str(out)
    if args.json:
        emit(args, payload, lambda d: None)
    elif args.format == "dot":
        print(to_dot(ids, requires), end="")
    elif args.format == "png":
        console.print(f"wrote {payload['png']}")
    else:
        for entry_id in ids:
            console.print(Text.assemble(f"{'  ' * layers(ids, requires)[entry_id]}{entry_id}",
                                        (f"  requires {', '.join(requires[entry_id])}" if requires[entry_id] else "", "dim")))
    return 0
