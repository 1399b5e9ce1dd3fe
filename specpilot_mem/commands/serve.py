"""``specpilot-mem serve NAME [--gpu N] -- <sglang server args>``: run a deployment on SGLang.

The deployment's branch (``rounds/NAME/deployment.yaml``) is exported once per tree under
``.specpilot/exports/`` and launched with ``python -m sglang.launch_server``, the export first on the
import path over an installed ``sglang==0.5.23`` (which supplies the dependencies). Its tuned options
come from ``rounds/NAME/options.yaml`` (``--specpilot-flag: value``), the arguments after ``--`` follow
them, so they win. Every ``--specpilot-*`` flag must belong to an entry the deployment applies.
The server runs until Ctrl-C (or SIGTERM), then stops with its workers.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from specpilot_mem.errors import RecordError, SpecPilotError
from specpilot_mem.home import Home, find_home
from specpilot_mem.output import console, emit, err_console, table

OPTIONS_FILE = "options.yaml"


def register(subparsers, common) -> None:
    parser = subparsers.add_parser(
        "serve", parents=[common], help="run a deployment's SGLang server", description=__doc__
    )
    parser.add_argument("name", metavar="NAME", help="deployment name (rounds/NAME/deployment.yaml)")
    add_serve_options(parser)
    # Everything after NAME: serve's own options, then `--` and SGLang's arguments (split in `run`).
    parser.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="-- SGLANG_ARGS", help="SGLang server arguments, after --"
    )
    parser.set_defaults(func=run)


def add_serve_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu", type=int, metavar="N", help="GPU index (sets CUDA_VISIBLE_DEVICES)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--python",
        default=sys.executable,
        metavar="PATH",
        help="interpreter with sglang==0.5.23 installed (default: this one)",
    )
    parser.add_argument("--log", metavar="FILE", help="write the server's output here (default: the terminal)")
    parser.add_argument("--dry-run", action="store_true", help="export and check, print the command, start nothing")


def split_rest(args) -> list[str]:
    """Parse serve's options given after NAME into ``args``; return SGLang's arguments (after ``--``)."""
    rest = list(args.rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    own, server_args = rest[:cut], rest[cut + 1 :]
    if own:
        from specpilot_mem.main import common_options

        late = argparse.ArgumentParser(
            prog="specpilot-mem serve NAME", parents=[common_options()], add_help=False, exit_on_error=False
        )
        add_serve_options(late)
        try:
            late.parse_args(own, namespace=args)
        except argparse.ArgumentError as err:
            raise SpecPilotError(
                f"cannot read serve's options: {err}", where=" ".join(own), fix="put SGLang's own arguments after `--`"
            ) from None
    return server_args


def tuned_options(home: Home, name: str) -> dict[str, Any]:
    import yaml  # here, not at the top: every command's module is imported for `--help`

    path = home.rounds / name / OPTIONS_FILE
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise RecordError(
            f"malformed YAML: {getattr(err, 'problem', err)}",
            where=f"{path}:{mark.line + 1 if mark else 1}",
            fix="fix the YAML syntax",
        ) from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and k.startswith("--") for k in data):
        raise RecordError(
            "tuned options must map flags to values, e.g. `--specpilot-w12-lm-head: true`",
            where=str(path),
            fix="one `--flag: value` per line",
        )
    return data


def option_argv(options: dict[str, Any]) -> list[str]:
    argv: list[str] = []
    for flag, value in options.items():
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def check_flags(home: Home, name: str, argv: list[str], manifest: dict) -> None:
    """Every ``--specpilot-*`` flag in ``argv`` must be declared by an entry the export carries."""
    from specpilot_mem.store.records import load_entries

    carried = set(manifest["options"])
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--specpilot-")}
    unknown = sorted(given - carried)
    if not unknown:
        return
    owners = {o.name: r.id for r in load_entries(home).values() for o in r.options}
    named = [
        f"{flag} (entry {owners[flag]})" if flag in owners else f"{flag} (no entry declares it)" for flag in unknown
    ]
    applied = ", ".join(e["id"] for e in manifest["entries"]) or "none"
    raise SpecPilotError(
        f"deployment {name} does not apply the entries these options belong to: {'; '.join(named)}",
        where=f"rounds/{name}/{OPTIONS_FILE} or the arguments after --  (applied: {applied})",
        fix="drop the option, or start a deployment that includes its entry (`specpilot-mem deploy new ... --from ID`)",
    )


def deployment_export(home: Home, name: str, show_progress: bool) -> tuple[Path, dict]:
    """The deployment's export (built once per tree) and its manifest."""
    from specpilot_mem.models import DeploymentRecord
    from specpilot_mem.sglang.export import cached_export, read_manifest
    from specpilot_mem.store.records import load_record_file

    path = home.rounds / name / "deployment.yaml"
    if not path.is_file():
        raise SpecPilotError(
            f"no deployment {name!r}", where=str(path), fix="create it with `specpilot-mem deploy new NAME ...`"
        )
    record = load_record_file(path, DeploymentRecord)
    export = cached_export(home, record.branch, record.entries, show_progress=show_progress)
    return export, read_manifest(export)


def run(args) -> int:
    from specpilot_mem.sglang.server import SGLangServer, check_runtime, launch_argv

    home = find_home(args.home)
    user_args = split_rest(args)
    export, manifest = deployment_export(home, args.name, show_progress=not args.json)
    argv = option_argv(tuned_options(home, args.name)) + list(user_args)
    check_flags(home, args.name, argv, manifest)
    if shutil.which(args.python) is None:
        raise SpecPilotError(
            f"no Python interpreter at {args.python}",
            where="--python",
            fix="pass the path of the Python that has SGLang's dependencies installed",
        )
    runtime = check_runtime(args.python)
    server = SGLangServer(
        export, argv, gpu=args.gpu, python=args.python, host=args.host, port=args.port, log_path=args.log
    )
    payload = {
        "deployment": args.name,
        "export": str(export),
        "tree": manifest["tree"],
        "entries": [e["id"] for e in manifest["entries"]],
        "sglang": runtime["sglang"],
        "command": launch_argv(args.python, argv, args.host, args.port),
        "gpu": args.gpu,
        "url": server.url,
    }

    def render(data) -> None:
        console.print(
            table(
                f"serve {data['deployment']}",
                ["field", "value"],
                [
                    ("export", data["export"]),
                    ("tree", data["tree"]),
                    ("entries", ", ".join(data["entries"]) or "-"),
                    ("sglang", data["sglang"]),
                    ("gpu", "-" if data["gpu"] is None else data["gpu"]),
                    ("url", data["url"]),
                    ("command", " ".join(data["command"])),
                ],
            )
        )

    if args.dry_run:
        emit(args, payload, render)
        return 0
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with server:
            emit(args, payload, render)
            err_console.print(f"serving {args.name} at {server.url}; Ctrl-C stops it")
            while not stop.wait(0.5):
                if server.process.poll() is not None:
                    raise SpecPilotError(
                        f"the SGLang server exited with status {server.process.returncode}",
                        where=server.url,
                        fix="read its log" + (f" at {args.log}" if args.log else ""),
                    )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    err_console.print("stopped")
    return 0
