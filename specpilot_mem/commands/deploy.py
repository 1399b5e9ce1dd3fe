"""``specpilot-mem deploy new|export``: start a deployment from stock plus memory entries, or export it.

``deploy new NAME --gpu ... --model ... --drafter ... --regime ... [--from ID,ID | --suggest]`` records
``rounds/NAME/deployment.yaml`` and resolves the chosen entries onto stock into the fork branch
``deploy/NAME`` (every entry of the chain checked to reproduce its source tree). ``--suggest`` proposes
the entries from the registry, with the reason for each, as the paper's master does for a new
deployment; ``--dry-run`` shows the selection and writes nothing. Bad input (a malformed name, unknown or
repeated entries, conflicting options, an existing deployment or branch) changes nothing.

``deploy export NAME DIR`` writes the deployment's tree as an importable SGLang package.
"""

from __future__ import annotations

import re

from specpilot_mem.output import console, emit, escape, marked, styled, table


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "deploy", parents=[common], help="start a deployment from memory entries, or export one", description=__doc__
    )
    verbs = parser.add_subparsers(dest="deploy_command", metavar="new|export", required=True)
    new = verbs.add_parser(
        "new", parents=[common], help="record a deployment and build its branch deploy/NAME", description=__doc__
    )
    new.add_argument("name", metavar="NAME", help="deployment name: lower-case letters, digits, '.', '_', '-'")
    new.add_argument(
        "--gpu", required=True, metavar="NAME", help='the GPU it serves on: H100, H200, "RTX PRO 6000", B200, ...'
    )
    new.add_argument("--model", required=True, metavar="NAME", help="target model, e.g. Qwen3.8-27B")
    new.add_argument("--drafter", required=True, metavar="NAME", help="drafter, e.g. DFlash2, DSpark, EAGLE-3")
    new.add_argument("--regime", required=True, choices=("single", "batch"), help="one request, or batched requests")
    new.add_argument("--batch-sizes", metavar="N,N", help="requests in flight (batch regime; single is 1)")
    pick = new.add_mutually_exclusive_group()
    pick.add_argument(
        "--from", dest="from_ids", metavar="ID,ID", help="entries to start from (their requirements come along)"
    )
    pick.add_argument("--suggest", action="store_true", help="let the registry propose the entries, with reasons")
    new.add_argument("--verified-only", action="store_true", help="with --suggest: leave candidate entries out")
    new.add_argument("--dry-run", action="store_true", help="show the selection, write nothing")
    new.set_defaults(func=run_new)

    export = verbs.add_parser(
        "export", parents=[common], help="write a deployment's tree as an importable sglang package"
    )
    export.add_argument("name", metavar="NAME")
    export.add_argument("dest", metavar="DIR")
    export.set_defaults(func=run_export)


def _parse_batch_sizes(text: str | None, regime: str) -> list[int]:
    from specpilot_mem.errors import SpecPilotError

    if text is None:
        if regime == "batch":
            raise SpecPilotError(
                "the batch regime needs --batch-sizes",
                where="--batch-sizes",
                fix="pass the numbers of requests in flight, e.g. --batch-sizes 8,16,24",
            )
        return [1]
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise SpecPilotError(
            f"--batch-sizes {text!r} is not a comma-separated list of integers",
            where="--batch-sizes",
            fix="e.g. --batch-sizes 8,16,24",
        ) from None
    if any(n < 1 for n in sizes) or len(set(sizes)) != len(sizes):
        raise SpecPilotError(
            f"--batch-sizes {text!r} must be distinct positive integers",
            where="--batch-sizes",
            fix="e.g. --batch-sizes 8,16,24",
        )
    if regime == "single" and sizes != [1]:
        raise SpecPilotError(
            f"the single regime serves one request, but --batch-sizes is {text}",
            where="--batch-sizes",
            fix="drop --batch-sizes, or use --regime batch",
        )
    if regime == "batch" and max(sizes) < 2:
        raise SpecPilotError(
            "the batch regime needs a batch size above 1",
            where="--batch-sizes",
            fix="e.g. --batch-sizes 8,16,24, or use --regime single",
        )
    return sorted(sizes)


def _check_name(home, name: str) -> None:
    from specpilot_mem.errors import SpecPilotError
    from specpilot_mem.models import DEPLOYMENT_NAME

    # deploy/NAME must also be a valid git branch name: no '..', no '.lock' ending, no leading '.'.
    if not re.match(DEPLOYMENT_NAME, name) or ".." in name or name.endswith(".lock"):
        raise SpecPilotError(
            f"{name!r} is not a valid deployment name",
            where="NAME",
            fix="use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. h200-qwen27b-dspark)",
        )
    if (home.rounds / name).exists():
        raise SpecPilotError(
            f"deployment {name!r} already exists",
            where=str(home.rounds / name),
            fix="choose another name (rounds/NAME holds a deployment's records)",
        )


def _parse_ids(text: str) -> list[str]:
    from specpilot_mem.errors import SpecPilotError

    ids = [part.strip() for part in text.split(",") if part.strip()]
    if not ids:
        raise SpecPilotError("--from names no entries", where="--from", fix="e.g. --from w12,certified-head")
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise SpecPilotError(
            f"--from names {', '.join(repeated)} more than once", where="--from", fix="name each entry once"
        )
    return ids


def run_new(args) -> int:
    import datetime as dt

    from specpilot_mem.errors import ForkError, SpecPilotError
    from specpilot_mem.gpus import GPUS, resolve_gpu_or_arch
    from specpilot_mem.home import find_home
    from specpilot_mem.models import DeploymentRecord
    from specpilot_mem.registry.query import require_known
    from specpilot_mem.registry.suggest import suggest_entries
    from specpilot_mem.registry.sync import DEPLOYMENT_FILE, connect
    from specpilot_mem.store.fork import open_fork
    from specpilot_mem.store.records import dump_record, write_atomic

    home = find_home(args.home)
    gpu, arch = resolve_gpu_or_arch(args.gpu)
    if gpu is None:
        raise SpecPilotError(
            f"a deployment runs on one GPU, and {args.gpu} is an arch",
            where="--gpu",
            fix=f"name the GPU ({', '.join(g.name for g in GPUS if g.arch == arch)}): its evidence records the GPU, not only the arch",
        )
    batch_sizes = _parse_batch_sizes(args.batch_sizes, args.regime)
    _check_name(home, args.name)
    ids = _parse_ids(args.from_ids) if args.from_ids else []

    con = connect(home)
    try:
        require_known(con, ids, "--from")
        suggestions, left_out = (
            suggest_entries(
                con,
                gpu=gpu,
                arch=arch,
                model=args.model,
                drafter=args.drafter,
                regime=args.regime,
                verified_only=args.verified_only,
            )
            if args.suggest
            else ([], [])
        )
    finally:
        con.close()
    if args.suggest:
        ids = [s.id for s in suggestions]

    branch = f"deploy/{args.name}"

    payload = {
        "name": args.name,
        "gpu": gpu.name,
        "arch": arch,
        "model": args.model,
        "drafter": args.drafter,
        "regime": args.regime,
        "batch_sizes": batch_sizes,
        "entries": ids,
        "branch": branch,
        "dry_run": args.dry_run,
        "suggestions": [
            {
                "id": s.id,
                "title": s.title,
                "status": s.status,
                "reasons": s.reasons,
                "flags": s.flags,
                "required_by": s.required_by,
            }
            for s in suggestions
        ],
        "left_out": [{"id": s.id, "title": s.title, "status": s.status, "why": s.reasons} for s in left_out],
        "preference": _preference(suggestions, left_out) if args.suggest else None,
    }
    if not args.dry_run:
        fork = open_fork(home)
        if fork.repo.rev_parse(f"refs/heads/{branch}") is not None:
            raise ForkError(
                f"the fork already has a branch {branch}",
                where=str(fork.repo.path),
                fix="choose another deployment name (or delete the branch if it is left over)",
            )
        order, base, tree, commit = _build_branch(home, fork, ids, branch)
        path = home.rounds / args.name / DEPLOYMENT_FILE
        try:
            record = DeploymentRecord(
                name=args.name,
                gpu=gpu.name,
                arch=arch,
                model=args.model,
                drafter=args.drafter,
                regime=args.regime,
                batch_sizes=batch_sizes,
                entries=order,
                suggested={s.id: s.reason for s in suggestions},
                base=base,
                branch=branch,
                tree=tree,
                created=dt.date.today(),
            )
            write_atomic(path, dump_record(record))
        except BaseException as err:
            # the branch was the first thing written: take it back so a failed command leaves nothing
            fork.repo.update_refs({f"refs/heads/{branch}": (commit, None)}, f"specpilot deploy new {args.name}: undo")
            if isinstance(err, OSError):
                raise SpecPilotError(
                    f"cannot write the deployment record: {err}",
                    where=str(path),
                    fix=f"make {home.rounds} a writable folder",
                ) from err
            raise
        payload.update(entries=order, base=base, tree=tree, commit=commit, record=str(path))
    emit(args, payload, _render_new)
    return 0


def _build_branch(home, fork, ids: list[str], branch: str) -> tuple[list[str], str, str, str]:
    """Resolve ``ids`` onto stock into ``branch``; (application order, stock commit, tree, commit)."""
    if ids:
        from specpilot_mem.store.resolver import apply_entries

        result = apply_entries(home, ids, onto="stock", branch=branch)
        return result.order, result.onto_commit, result.tree, result.commit
    # A deployment with no entries starts at stock itself.
    with fork.lock():
        fork.repo.update_refs(
            {f"refs/heads/{branch}": (None, fork.stock_commit)}, f"specpilot deploy new: {branch} at stock"
        )
    return [], fork.stock_commit, fork.stock_tree, fork.stock_commit


def _preference(suggestions, left_out) -> str:
    """What --suggest says about its preference for verified entries."""
    verified = sum(1 for s in suggestions if s.status == "verified")
    others = len(suggestions) - verified
    text = f"verified entries preferred: {verified} verified"
    text += f", {others} not verified (flagged)" if others else ""
    return text + (f", {len(left_out)} left out ({', '.join(s.id for s in left_out)})" if left_out else "")


def _render_new(data: dict) -> None:
    if data["suggestions"]:
        rows = [
            (
                s["id"],
                styled(s["status"], "green" if s["status"] == "verified" else "yellow"),
                s["title"],
                "\n".join(s["reasons"]),
                marked("\n".join(f"[bold red]! {escape(f)}[/]" for f in s["flags"])),
            )
            for s in data["suggestions"]
        ]
        console.print(
            table(
                f"suggested for {data['gpu']} ({data['arch']}), {data['model']}, {data['drafter']}, {data['regime']}",
                ["entry", "status", "title", "why", "untested"],
                rows,
            )
        )
    if data["left_out"]:
        console.print(
            table(
                f"left out ({len(data['left_out'])})",
                ["entry", "status", "why"],
                [(s["id"], s["status"], "; ".join(s["why"])) for s in data["left_out"]],
            )
        )
    if data["preference"] is not None and not data["suggestions"]:
        console.print(
            "nothing matched this deployment"
            + (" (the memory has no entries)" if not data["left_out"] else ": each entry above says why")
            + "; it starts from stock"
        )
    if data["preference"]:
        console.print(data["preference"])
    elif data["entries"] == [] and not data["dry_run"]:
        console.print("no entries: the deployment starts from stock")
    if data["dry_run"]:
        console.print(
            f"dry run: would record rounds/{data['name']}/deployment.yaml and branch {data['branch']} "
            f"with {len(data['entries'])} entries; nothing written"
        )
        return
    console.print(f"recorded {data['record']}")
    console.print(
        f"branch {data['branch']} at {data['commit'][:12]} (tree {data['tree'][:12]}, "
        f"{len(data['entries'])} entries: {', '.join(data['entries']) or 'stock only'})"
    )


def run_export(args) -> int:
    from pathlib import Path

    from specpilot_mem.errors import RecordError
    from specpilot_mem.home import find_home
    from specpilot_mem.registry.sync import DEPLOYMENT_FILE, read_deployment
    from specpilot_mem.sglang.export import export_tree

    home = find_home(args.home)
    if not (home.rounds / args.name / DEPLOYMENT_FILE).is_file():
        known = sorted(p.parent.name for p in home.rounds.glob(f"*/{DEPLOYMENT_FILE}"))
        raise RecordError(
            f"no deployment {args.name!r}",
            where=str(home.rounds),
            fix="known deployments: " + (", ".join(known) or "(none; create one with `specpilot-mem deploy new`)"),
        )
    record = read_deployment(home, args.name)
    manifest = export_tree(home, record.tree, Path(args.dest), record.entries, show_progress=not args.json)
    payload = {"name": record.name, "tree": record.tree, "dest": str(Path(args.dest).resolve()), "manifest": manifest}
    emit(
        args,
        payload,
        lambda d: console.print(f"exported deployment {d['name']} (tree {d['tree'][:12]}) to {d['dest']}"),
    )
    return 0
