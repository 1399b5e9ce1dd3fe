"""``specpilot-mem query``: what the memory knows for a GPU, model, drafter or regime.

An entry matches a GPU when it has evidence on that GPU's arch or a variant built for it; the hardware
column tells evidence on that very GPU apart from evidence on another GPU of the same arch and from a
variant that was never run there. Untested regimes (and GPUs, drafters, models) that the query asks
about are flagged.
"""

from __future__ import annotations

from dataclasses import asdict

from specpilot_mem.output import console, emit, escape, marked, table

HARDWARE_LABEL = {"gpu": "this GPU", "arch": "same arch", "variant": "variant only", None: ""}
STATUS_COLOUR = {"verified": "green", "candidate": "yellow", "superseded": "cyan", "unchecked": "dim"}


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "query", parents=[common], help="find entries for a GPU, model, drafter or regime", description=__doc__
    )
    parser.add_argument(
        "--gpu", metavar="NAME|ARCH", help='a GPU name (H100, H200, "RTX PRO 6000", B200) or an arch id (sm_90)'
    )
    parser.add_argument("--arch", metavar="ARCH", help="an arch id: sm_80, sm_90, sm_100, sm_120")
    parser.add_argument(
        "--model", metavar="NAME", help="target model the evidence was measured on (substring, case-insensitive)"
    )
    parser.add_argument(
        "--drafter", metavar="NAME", help="drafter the evidence was measured with (substring, case-insensitive)"
    )
    parser.add_argument("--regime", choices=("single", "batch"), help="serving regime of the evidence")
    parser.add_argument("--requires", metavar="ID", help="entries that need this entry (directly or through others)")
    parser.add_argument("--text", metavar="WORDS", help="words that must all appear in the title, summary or limits")
    parser.add_argument(
        "--validated-only",
        action="store_true",
        help="only entries timed end to end on real weights (non-synthetic paired run) and never rejected",
    )
    parser.add_argument(
        "--status",
        choices=("verified", "candidate", "superseded", "unchecked"),
        help="entries with this status (on --release when given, else on each entry's own release)",
    )
    parser.add_argument("--release", metavar="X", help="an SGLang release: show (and filter) each entry's status there")
    parser.set_defaults(func=run)


def filters_of(args):
    from specpilot_mem.errors import SpecPilotError
    from specpilot_mem.registry.query import QueryFilters

    for option in ("gpu", "arch", "model", "drafter", "requires", "text", "release"):
        value = getattr(args, option)
        if value is not None and not value.strip():
            raise SpecPilotError(
                f"--{option} is empty",
                where=f"--{option}",
                fix=f"give --{option} a value, or leave it out to not filter on it",
            )

    return QueryFilters(
        gpu=args.gpu,
        arch=args.arch,
        model=args.model,
        drafter=args.drafter,
        regime=args.regime,
        requires=args.requires,
        text=args.text,
        validated_only=args.validated_only,
        status=args.status,
        release=args.release,
    )


def run(args) -> int:
    from specpilot_mem.home import find_home
    from specpilot_mem.registry.query import query_entries
    from specpilot_mem.registry.sync import connect

    filters = filters_of(args)
    gpu, arch = filters.hardware()  # bad hardware names fail before the registry is touched
    home = find_home(args.home)
    con = connect(home)
    try:
        matches = query_entries(con, filters)
    finally:
        con.close()
    payload = {
        "filters": {k: v for k, v in asdict(filters).items() if v},
        "gpu": gpu.name if gpu else None,
        "arch": arch,
        "release": args.release,
        "count": len(matches),
        "entries": [{**asdict(m), "flagged": m.flagged} for m in matches],
    }
    emit(args, payload, lambda data: render(data, matches))
    return 0


def render(data: dict, matches) -> None:
    where = " ".join(f"{k}={v}" for k, v in data["filters"].items())
    if not matches:
        console.print(f"no entries match {where or 'an empty memory'}")
        return
    rows = []
    for m in matches:
        entry = marked(f"[bold]{escape(m.id)}[/]\n{escape(m.title)}" + ("\n[green]validated[/]" if m.validated else ""))
        colour = STATUS_COLOUR[m.release_status]
        status = f"[{colour}]{m.release_status}[/]\n" + escape(
            f"on {data['release'] or m.scope_sglang or 'no release'}"
        )
        others = [f"{r['release']}: {r['status']}" for r in m.releases if r["release"] != data["release"]]
        status = marked(status + (("\n" + escape(", ".join(others))) if others else ""))
        hardware = ""
        if m.hardware:
            colour = {"gpu": "green", "arch": "yellow", "variant": "magenta"}[m.hardware]
            hardware = marked(f"[{colour}]{HARDWARE_LABEL[m.hardware]}[/]\n{escape(m.hardware_note)}")
        evidence = ""
        if m.best:
            b = m.best
            setting = " ".join(x for x in (b.gpu, b.regime, b.drafter, b.target) if x)
            evidence = f"{b.headline()} {b.kind}{' (synthetic)' if b.synthetic else ''}\n{setting}"
            if m.evidence_count > 1:
                evidence += f"\n+{m.evidence_count - 1} more"
        untested = marked(
            "\n".join(
                (f"[bold red]! {escape(u['note'])}[/]" if u["relevant"] else escape(u["note"])) for u in m.untested
            )
        )
        requires = ", ".join(m.requires[:3]) + (f" +{len(m.requires) - 3}" if len(m.requires) > 3 else "")
        rows.append((entry, status, hardware, evidence, untested, requires))
    title = f"{len(matches)} entr{'y' if len(matches) == 1 else 'ies'}" + (f" for {where}" if where else "")
    result = table(title, ["entry", "status", "hardware", "best evidence", "untested", "requires"], rows)
    for column in result.columns:
        column.overflow = "fold"  # wrap long ids and names instead of cutting them off
    console.print(result)
    if data["arch"]:
        counts = {label: sum(1 for m in matches if m.hardware == key) for key, label in HARDWARE_LABEL.items() if key}
        console.print(", ".join(f"{label}: {n}" for label, n in counts.items()))
