"""``specpilot-mem replay LATTICES... --builders ... --nodes ...``: τ(N) per builder and benchmark in
exact replay (§6.4), and the paper's Figure 10 with ``--plot``."""

from __future__ import annotations

from pathlib import Path

from specpilot_mem.errors import SpecPilotError
from specpilot_mem.output import console, emit, progress, table


def int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values):
        raise SpecPilotError(
            f"{text!r} is not a comma-separated list of node budgets", where="--nodes", fix="e.g. --nodes 8,16,32,64"
        )
    return values


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "replay", parents=[common], help="exact replay of draft trees on recorded lattices", description=__doc__
    )
    parser.add_argument("lattices", nargs="+", metavar="LATTICES", help="lattice files (.npz, docs/lattice-format.md)")
    parser.add_argument(
        "--builders",
        default="chain,best-first,ddtree,eagle2,sequoia,oracle",
        help="comma-separated: chain, best-first, ddtree, eagle2, sequoia, oracle",
    )
    parser.add_argument("--nodes", default="8,16,32,64", help="node budgets N (default 8,16,32,64)")
    parser.add_argument("--depth-cap", type=int, default=None, help="deepest node (default: the lattice's positions)")
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="requests in flight sharing one node budget per step, closed loop (best-first only; default 1)",
    )
    parser.add_argument("--plot", metavar="PNG", help="draw Figure 10 (τ against N) to this PNG")
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem.replay.lattice import load_lattices
    from specpilot_mem.replay.replay import replay_set
    from specpilot_mem.replay.trees import get_builder

    builders = [b.strip() for b in args.builders.split(",") if b.strip()]
    for name in builders:
        get_builder(name)
    nodes = int_list(args.nodes)
    if args.batch < 1:
        raise SpecPilotError(f"--batch {args.batch} must be at least 1", where="--batch", fix="e.g. --batch 8")
    if args.plot:
        blocking = next(
            (p for p in Path(args.plot).expanduser().resolve().parents if p.exists() and not p.is_dir()), None
        )
        if blocking is not None:  # checked before the replay, not after it
            raise SpecPilotError(
                f"cannot write {args.plot}: {blocking} is a file, not a folder",
                where="--plot",
                fix="pass a path whose folders are folders (missing ones are created)",
            )
    lattices = load_lattices(args.lattices)
    groups = len({lat.positions for lat in lattices})
    with progress("replay", groups * len(builders) * len(nodes), enabled=not args.json) as bar:
        runs = replay_set(lattices, builders, nodes, args.depth_cap, args.batch, progress=bar)
    plot = None
    if args.plot:
        from specpilot_mem.replay.plot import plot_tau

        plot = str(plot_tau(runs, args.plot))
    payload = {"synthetic": any(r.synthetic for r in runs), "runs": [r.to_dict() for r in runs], "plot": plot}
    emit(args, payload, render)
    return 0


def render(payload: dict) -> None:
    labels = sorted({label for r in payload["runs"] for label in r["tau_by_label"]})
    title = "τ in exact replay" + (" — SYNTHETIC lattices" if payload["synthetic"] else "")
    rows = [
        [
            r["positions"],
            r["builder"],
            r["nodes"],
            f"{r['tau']:.3f}",
            r["steps"],
            *(f"{r['tau_by_label'][lab]:.3f}" if lab in r["tau_by_label"] else "" for lab in labels),
        ]
        for r in payload["runs"]
    ]
    console.print(table(title, ["positions", "builder", "N", "τ", "steps", *labels], rows))
    if payload["plot"]:
        console.print(f"plot: {payload['plot']}")
