"""``specpilot-mem ceiling PROFILE --lattices ...``: the ceiling of the system a round starts from
(§3.1, Eq. 4), its factors and the leading one, and S(N) = τ(N)/c(N) per node budget."""

from __future__ import annotations

from specpilot_mem.output import assemble, console, emit, progress, table


def register(subparsers, common) -> None:
    from specpilot_mem.costmodel.settings import SETTINGS

    parser = subparsers.add_parser(
        "ceiling", parents=[common], help="ceiling factorization from a profile and lattices", description=__doc__
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile JSON (docs/profile-format.md)")
    parser.add_argument("--lattices", nargs="+", required=True, help="lattice files of the same system")
    parser.add_argument(
        "--setting",
        choices=sorted(SETTINGS),
        default="section-3.1",
        help="section-3.1: best-first τ_best, floors at 60%%/90%% of peak; appendix-b: oracle τ, floors at full peak",
    )
    parser.add_argument("--nodes", default="8,16,32,64", help="node budgets for τ(N) and S(N)")
    parser.add_argument(
        "--depth-cap", type=int, default=None, help="deepest tree node (default: the lattice's positions)"
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from specpilot_mem.commands.replay import int_list
    from specpilot_mem.costmodel.ceiling import ceiling_report

    nodes = int_list(args.nodes)
    with progress("replay", len(nodes) + 1, enabled=not args.json) as bar:
        payload = ceiling_report(args.profile, args.lattices, args.setting, nodes, args.depth_cap, progress=bar)
    emit(args, payload, render)
    return 0


def render(p: dict) -> None:
    note = " — SYNTHETIC inputs" if p["synthetic"] else ""
    f = p["factors"]
    console.print(
        table(
            f"ceiling {p['ceiling']:.2f}x on {p['gpu']} ({p['setting']}){note}",
            ["factor", "value", "from"],
            [
                ["τ", f"{f['tau']:.2f}x", f"τ_best {p['tau_best']:.3f} ({p['tau_from']}) / τ {p['tau']:.3f}"],
                ["kernel", f"{f['kernel']:.2f}x", f"T_prof {p['T_prof_ms']:.3f} ms / T_floor {p['T_floor_ms']:.3f} ms"],
                ["overhead", f"{f['overhead']:.2f}x", f"T_step {p['T_step_ms']:.3f} ms / T_prof"],
            ],
        )
    )
    console.print(assemble("leading factor: ", (p["leading"], "bold")))
    console.print(
        table("byte floors", ["kernel class", "floor ms"], [[k, f"{v:.4f}"] for k, v in p["floors_ms"].items()])
    )
    console.print(
        table(
            "S(N) = τ(N) / c(N)",
            ["N", "τ(N)", "T_step ms", "c(N)", "S(N)", "step time"],
            [
                [
                    r["nodes"],
                    f"{r['tau']:.3f}",
                    f"{r['T_step_ms']:.3f}",
                    f"{r['c']:.3f}",
                    f"{r['S']:.2f}",
                    r["step_time"],
                ]
                for r in p["speedup"]
            ],
        )
    )
