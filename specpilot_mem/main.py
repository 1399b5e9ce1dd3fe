"""The ``specpilot-mem`` command line.

Each verb is one module under ``specpilot_mem/commands/`` that defines

    def register(subparsers, common) -> None   # adds its parser(s), parents=[common], set_defaults(func=...)

and a ``func(args) -> int`` for each (sub)command. Modules are discovered, so adding a verb never
edits this file. ``common`` carries ``--home`` and ``--json``, which every command accepts.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from specpilot_mem import __version__
from specpilot_mem.errors import EXIT_ERROR, UsageError, error_handler
from specpilot_mem.output import print_error


def common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a nested verb (`registry sync`) has these at both levels, and a sub-parser's default would
    # overwrite a value given at the outer level (`registry --json sync`); main() fills the defaults in.
    common.add_argument(
        "--home",
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="memory home (default: $SPECPILOT_HOME, else the nearest folder with entries/)",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print machine-readable JSON instead of tables"
    )
    return common


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors raised as ``UsageError`` (so ``--json`` gets them as JSON), not printed."""

    def error(self, message: str):
        raise UsageError(message, where=self.prog, fix=f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    from specpilot_mem import commands

    parser = _Parser(
        prog="specpilot-mem",
        description="Memory and patch management for speculative decoding on an SGLang fork.",
    )
    parser.add_argument("--version", action="version", version=f"specpilot-mem {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = common_options()
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"specpilot_mem.commands.{info.name}")
        module.register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv  # before parsing, so a usage error is JSON too
    with error_handler(argv, as_json, lambda err: print_error(err, as_json=as_json)) as code:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.home = getattr(args, "home", None)
        args.json = getattr(args, "json", False)
        if not getattr(args, "func", None):  # no verb, or a verb without its sub-verb (`entry`, `deploy` ...)
            if as_json:
                raise UsageError(
                    "no command given",
                    where=" ".join(["specpilot-mem", *argv]),
                    fix="name a command (`specpilot-mem --help` lists them)",
                )
            parser.print_help()
            return EXIT_ERROR
        code[0] = int(args.func(args) or 0)
    return code[0]


if __name__ == "__main__":
    raise SystemExit(main())
