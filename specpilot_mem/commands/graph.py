"""``specpilot-mem graph [ID...]``: the requirement graph, as text, Graphviz dot or a PNG picture."""

from __future__ import annotations

from pathlib import Path

from specpilot_mem.home import find_home
from specpilot_mem.optional import pyplot
from specpilot_mem.errors import SpecPilotError
from specpilot_mem.output import console, emit


def register(subparsers, common) -> None:
    parser = subparsers.add_parser("graph", parents=[common], help="the requirement graph", description=__doc__)
    parser.add_argument("ids", nargs="*", metavar="ID", help="only these entries and their requirements")
    parser.add_argument("--format", choices=["text", "dot", "png"], default="text")
    parser.add_argument("--output", metavar="FILE", help="where --format png writes the picture (required with it)")
    parser.set_defaults(func=run)


def layers(order: list[str], requires: dict[str, list[str]]) -> dict[str, int]:
    """Depth of each entry: 0 for entries that require nothing, else 1 + its deepest requirement."""
    depth: dict[str, int] = {}
    for entry_id in order:
        depth[entry_id] = 1 + max((depth[r] for r in requires[entry_id]), default=-1)
    return depth


def to_dot(order: list[str], requires: dict[str, list[str]]) -> str:
    lines = [
        "digraph entries {",
        "  rankdir=BT;",
        '  node [shape=box, fontname="Helvetica"];',
        '  "stock" [shape=ellipse];',
    ]
    for entry_id in order:
        targets = requires[entry_id] or ["stock"]
        lines += [f'  "{entry_id}" -> "{t}";' for t in targets]
    return "\n".join(lines + ["}"]) + "\n"


def to_tree(order: list[str], requires: dict[str, list[str]]) -> list[str]:
    """The requirements as a tree under stock: each entry under every entry it requires (so one with two
    requirements appears twice); a subtree already drawn is drawn once more as its root and "(see above)"."""
    children: dict[str, list[str]] = {"stock": []}
    for entry_id in order:
        children.setdefault(entry_id, [])
        for parent in requires[entry_id] or ["stock"]:
            children[parent].append(entry_id)
    lines, drawn = ["stock"], set()

    def draw(node: str, indent: str) -> None:
        kids = children[node]
        for n, child in enumerate(kids):
            last = n == len(kids) - 1
            again = child in drawn and children[child]
            lines.append(f"{indent}{'└── ' if last else '├── '}{child}{' (see above)' if again else ''}")
            if not again:
                drawn.add(child)
                draw(child, indent + ("    " if last else "│   "))

    draw("stock", "")
    return lines


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
            ax.annotate(
                "", xy=(x1, y1 + 0.12), xytext=(x0, y0 - 0.12), arrowprops={"arrowstyle": "->", "color": "0.45"}
            )
    for name, (x, y) in pos.items():
        ax.text(
            x,
            y,
            name,
            ha="center",
            va="center",
            fontsize=10,
            bbox={"boxstyle": "round", "fc": "#dde8f5" if name != "stock" else "#eeeeee", "ec": "0.3"},
        )
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
        if not args.output:
            raise SpecPilotError(
                "--format png needs --output FILE",
                where="--output",
                fix="name the picture, e.g. --output entry-graph.png",
            )
        out = Path(args.output).expanduser()
        if not out.parent.is_dir() or out.is_dir():
            raise SpecPilotError(
                f"cannot write {out}: " + ("it is a folder" if out.is_dir() else f"there is no folder {out.parent}"),
                where="--output",
                fix="pass a file path in an existing folder (create the folder first)",
            )
        to_png(ids, requires, out)
        payload["png"] = str(out)
    elif args.output:
        raise SpecPilotError(
            "--output is only for --format png",
            where="--output",
            fix="leave it out, or add --format png (text and dot go to standard output)",
        )
    payload["tree"] = to_tree(ids, requires)
    if args.json:
        emit(args, payload, lambda d: None)
    elif args.format == "dot":
        print(to_dot(ids, requires), end="")
    elif args.format == "png":
        console.print(f"wrote {payload['png']}")
    else:
        for line in payload["tree"]:
            console.print(line)
    return 0
