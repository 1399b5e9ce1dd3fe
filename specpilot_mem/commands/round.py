"""``specpilot-mem round start|resume|status|report``: run a round of one deployment."""

from __future__ import annotations

import shlex
from pathlib import Path

from specpilot_mem.errors import RoundError, SpecPilotError
from specpilot_mem.home import find_home
from specpilot_mem.output import assemble, console, emit, table


def register(sub, common) -> None:
    parser = sub.add_parser("round", help="run an optimization round of a deployment (phases 0-4)")
    verbs = parser.add_subparsers(dest="round_command", metavar="VERB", required=True)

    start = verbs.add_parser("start", parents=[common], help="start the next round of DEPLOYMENT and run it")
    start.add_argument("deployment")
    start.add_argument("--requests", required=True, help="request-set JSONL with dev and unseen splits")
    start.add_argument(
        "--devices",
        default="cuda:0",
        help="comma-separated devices, one direction per device (cuda:0,cuda:1; cuda:0#0,cuda:0#1 for "
        "two slots on one GPU), or with --pool ray the number of GPUs to reserve",
    )
    start.add_argument(
        "--pool",
        choices=["process", "ray"],
        default="process",
        help="where timed systems run: worker processes on this host, or Ray actors across a cluster",
    )
    start.add_argument("--address", help="the Ray cluster (e.g. 10.0.0.1:6379; default: RAY_ADDRESS or a local one)")
    start.add_argument(
        "--reuse-workers",
        action="store_true",
        help="one worker per system and device for a whole paired run (default: a fresh one per timed run)",
    )
    start.add_argument("--warmup-requests", type=int, help="perturbed warm-up requests per worker (default: all)")
    start.add_argument("--agent", choices=["anthropic", "command"], default="anthropic")
    start.add_argument("--model", default="claude-opus-4-5", help="model for the anthropic backend")
    start.add_argument(
        "--agent-command", help="command line for the command backend; {brief} / {brief_file} are filled in"
    )
    start.add_argument("--batch-sizes", default="1")
    start.add_argument("--repeats", type=int, default=2)
    start.add_argument("--max-new-tokens", type=int)
    start.add_argument("--sealed-max-new-tokens", type=int, help="longer outputs for the sealed final")
    start.add_argument(
        "--no-sealed-long-outputs",
        action="store_true",
        help="without --sealed-max-new-tokens, keep the dev output length for the sealed final instead of "
        "the long-output pass (4,096 tokens or the scorer's context)",
    )
    start.add_argument("--system-repo", help="the system's git repo (default: the memory's sglang-fork)")
    start.set_defaults(func=run_start)

    for name, func, text in (
        ("resume", run_resume, "continue a round after a crash or Ctrl-C"),
        ("status", run_status, "show where a round is"),
        ("report", run_report, "promotions, cost and the throughput picture of a round"),
    ):
        verb = verbs.add_parser(name, parents=[common], help=text)
        verb.add_argument("deployment")
        verb.add_argument("--round", type=int, help="round number (default: the latest)")
        if name == "report":
            verb.add_argument("--plot", metavar="PNG", help="write Figure 8 (throughput over promotions) here")
        verb.set_defaults(func=func)


def _round_dir(home, args):
    from specpilot_mem.rounds.files import RoundDir, latest_round

    from specpilot_mem.registry.sync import DEPLOYMENT_FILE

    if not (home.rounds / args.deployment / DEPLOYMENT_FILE).is_file():
        known = sorted(p.parent.name for p in home.rounds.glob(f"*/{DEPLOYMENT_FILE}")) if home.rounds.is_dir() else []
        raise RoundError(
            f"there is no deployment {args.deployment!r}",
            where=str(home.rounds / args.deployment / DEPLOYMENT_FILE),
            fix=f"known deployments: {', '.join(known)}"
            if known
            else f"create it with `specpilot-mem deploy new {args.deployment} --gpu ... --model ... "
            "--drafter ... --regime ...`",
        )
    number = args.round or latest_round(home, args.deployment)
    if number == 0:
        raise RoundError(
            f"deployment {args.deployment!r} has no rounds",
            where=str(home.rounds / args.deployment),
            fix=f"start one with `specpilot-mem round start {args.deployment} --requests FILE`",
        )
    return RoundDir.of(home, args.deployment, number)


def _backend(config):
    from specpilot_mem.rounds.agents import make_backend

    return make_backend(config.agent)


def run_start(args) -> int:
    from specpilot_mem.rounds.models import RoundConfig
    from specpilot_mem.rounds.runner import RoundRunner

    home = find_home(args.home)
    agent = (
        {"backend": "anthropic", "model": args.model}
        if args.agent == "anthropic"
        else {"backend": "command", "command": shlex.split(args.agent_command or "")}
    )
    config = RoundConfig(
        system_repo=str(Path(args.system_repo or home.fork).resolve()),
        requests=str(Path(args.requests).resolve()),
        devices=_devices(args),
        batch_sizes=[int(b) for b in args.batch_sizes.split(",")],
        repeats=args.repeats,
        max_new_tokens=args.max_new_tokens,
        sealed_max_new_tokens=args.sealed_max_new_tokens,
        sealed_long_outputs=not args.no_sealed_long_outputs,
        agent=agent,
        pool=_pool(args),
        fresh_workers=not args.reuse_workers,
        warmup_requests=args.warmup_requests,
    )
    backend = _backend(config)
    runner = RoundRunner.start(home, args.deployment, config, backend)
    try:
        state = runner.run()
    except BaseException as err:
        if runner.state.done:  # past its first phase: `round resume` continues it
            raise
        _discard(runner)  # it never got its system going: keep nothing of it
        if isinstance(err, SpecPilotError):
            raise RoundError(
                f"round {runner.state.number} of {args.deployment} could not start: {err.what}; nothing of it was kept",
                where=err.where,
                fix=err.fix,
            ) from err
        raise
    return _show(args, runner.dir, state)


def _discard(runner) -> None:
    """Remove a round that finished no phase: its folder, its lineage refs and any work trees it made."""
    import shutil

    from specpilot_mem.git import Repo

    repo = Repo(runner.state.config.system_repo)
    refs = repo.refs(f"refs/heads/{runner.state.lineage}")
    repo.update_refs({ref: (oid, None) for ref, oid in refs.items()}, "specpilot: discard a round that did not start")
    shutil.rmtree(runner.dir.path, ignore_errors=True)
    repo.git("worktree", "prune", check=False)


def _devices(args) -> list[str]:
    """``--devices``: slot names, or with a Ray pool a number of GPUs (slots gpu:0 ... gpu:N-1)."""
    if args.pool == "ray":
        if not args.devices.isdigit() or int(args.devices) < 1:
            raise RoundError(
                f"with --pool ray, --devices is the number of GPUs, not {args.devices!r}",
                where="--devices",
                fix="e.g. --pool ray --devices 2",
            )
        return [f"gpu:{i}" for i in range(int(args.devices))]
    return args.devices.split(",")


def _pool(args) -> dict:
    if args.pool == "process":
        if args.address:
            raise RoundError(
                "--address names a Ray cluster; the process pool runs on this host",
                where="--address",
                fix="add --pool ray, or drop --address",
            )
        return {"kind": "process"}
    return {"kind": "ray", **({"address": args.address} if args.address else {})}


def run_resume(args) -> int:
    from specpilot_mem.rounds.runner import RoundRunner

    home = find_home(args.home)
    round_dir = _round_dir(home, args)
    state = round_dir.load_state()
    runner = RoundRunner(home, round_dir, _backend(state.config))
    return _show(args, round_dir, runner.run())


def run_status(args) -> int:
    home = find_home(args.home)
    round_dir = _round_dir(home, args)
    return _show(args, round_dir, round_dir.load_state())


def _show(args, round_dir, state) -> int:
    from specpilot_mem.rounds.models import PHASES

    directions = round_dir.directions()
    payload = {
        "round": str(round_dir.path),
        "deployment": state.deployment,
        "number": state.number,
        "done": state.done,
        "next": next((p for p in PHASES if p not in state.done), None),
        "best": state.best,
        "lineage": state.lineage,
        "sealed": state.sealed,
        "distilled": state.distilled,
        "directions": [
            {"id": d.spec.id, "kind": d.kind, "status": d.status, "decision": d.decision} for d in directions
        ],
    }

    def render(p):
        console.print(
            assemble((p["deployment"], "bold"), f" round {p['number']}  lineage {p['lineage']}  best {p['best'][:12]}")
        )
        console.print(
            table(
                "phases",
                ["phase", "state"],
                [(ph, "done" if ph in p["done"] else ("next" if ph == p["next"] else "")) for ph in PHASES],
            )
        )
        if p["directions"]:
            console.print(
                table(
                    "directions",
                    ["id", "kind", "status", "why"],
                    [(d["id"], d["kind"], d["status"], d["decision"]) for d in p["directions"]],
                )
            )
        if p["sealed"]:
            console.print(
                f"sealed final: {'accepted' if p['sealed'].get('accepted') else 'not accepted'} "
                f"{'; '.join(p['sealed'].get('reasons', []))}"
            )
            if p["sealed"].get("power"):
                console.print(f"sealed final's token forcing ({p['sealed']['verdict']}): {p['sealed']['power']}")
        if p["distilled"]:
            console.print("distilled into entries: " + ", ".join(p["distilled"]))

    emit(args, payload, render)
    return 0


def run_report(args) -> int:
    from specpilot_mem.rounds.report import plot_progress, round_report

    home = find_home(args.home)
    report = round_report(_round_dir(home, args))
    if args.plot:
        report["plot"] = str(plot_progress(report, Path(args.plot)))

    def render(r):
        console.print(
            table(
                f"{r['deployment']} round {r['round']}: promotions (Table A3)",
                ["#", "direction", "phase", "gain", "95% CI", "token forcing"],
                [
                    (
                        p["order"],
                        p["direction"],
                        p["phase"],
                        f"{p['gain']:.3f}x",
                        f"[{p['ci_low']:.3f}, {p['ci_high']:.3f}]",
                        p["token_forcing"],
                    )
                    for p in r["promotions"]
                ],
            )
        )
        console.print(
            table(
                "directions",
                ["id", "kind", "status", "net headroom", "why"],
                [
                    (
                        d["id"],
                        d["kind"],
                        d["status"],
                        "" if d["headroom"] is None else f"{d['headroom']:.1%}",
                        d["decision"],
                    )
                    for d in r["directions"]
                ],
            )
        )
        cost = r["cost"]
        wall = "running" if cost["wall_hours"] is None else f"{cost['wall_hours']:.2f}"
        console.print(
            table(
                "cost (Table A4)",
                ["wall hours", "device hours", "code changes", "promotions", "agent tokens in/out"],
                [
                    (
                        wall,
                        f"{cost['gpu_hours']:.3f}",
                        cost["code_changes"],
                        cost["promotions"],
                        f"{cost['agent_tokens']['input_tokens']}/{cost['agent_tokens']['output_tokens']}",
                    )
                ],
            )
        )
        if r.get("plot"):
            console.print(f"Figure 8 written to {r['plot']}")

    emit(args, report, render)
    return 0
