"""User-facing errors. Every failure a user can cause says what went wrong, where, and how to fix it.

Commands raise these and change nothing; ``main`` prints them (or their JSON form) and exits 2. Anything
else is a defect: ``error_handler`` prints one line naming a log file that holds the traceback, and exits 3.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

EXIT_ERROR = 2  # the user can fix it (bad input or state); usage errors too, told apart by "error": "UsageError"
EXIT_DEFECT = 3  # a bug in specpilot-mem: one line, the traceback in the log
EXIT_INTERRUPTED = 130


class SpecPilotError(Exception):
    """A failure caused by input or state the user can fix."""

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.fix = fix

    def to_dict(self) -> dict:
        return {"error": type(self).__name__, "what": self.what, "where": self.where, "fix": self.fix}

    def __str__(self) -> str:
        lines = [self.what]
        if self.where:
            lines.append(f"  where: {self.where}")
        if self.fix:
            lines.append(f"  fix:   {self.fix}")
        return "\n".join(lines)


class RecordError(SpecPilotError):
    """A malformed or invalid YAML record (entry, deployment, round file)."""


class UnknownEntryError(SpecPilotError):
    """An entry id that the memory does not hold."""


class RequirementError(SpecPilotError):
    """A missing requirement or a requirement cycle."""


class ConflictError(SpecPilotError):
    """Entries whose deltas do not apply together."""


class DeltaError(SpecPilotError):
    """A delta that is corrupt, truncated, or touches paths it must not."""


class ForkError(SpecPilotError):
    """The fork is missing, dirty, locked, or its stock does not match the pin."""


class ReproductionError(SpecPilotError):
    """An entry chain that does not reproduce its source system's tree."""


class RegistryError(SpecPilotError):
    """A registry query or SQL statement that cannot run."""


class RoundError(SpecPilotError):
    """A round that cannot start, resume or advance."""


class UsageError(SpecPilotError):
    """A command line argparse refuses (unknown option, missing or malformed argument)."""


class LockTimeout(SpecPilotError):
    """Another specpilot-mem process holds the memory's write lock for longer than the wait allows."""


def log_path() -> Path:
    """Where unexpected errors are logged: ``$SPECPILOT_LOG``, else the user's cache folder."""
    if os.environ.get("SPECPILOT_LOG"):
        return Path(os.environ["SPECPILOT_LOG"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "specpilot" / "specpilot-mem.log"


@contextmanager
def error_handler(argv: list[str], as_json: bool, report) -> Iterator[list[int]]:
    """Run a command: ``SpecPilotError`` -> ``report(err)``, exit 2; Ctrl-C -> exit 130; anything else ->
    one line naming the log, the traceback (with versions and the command line) appended to it, exit 3.
    Yields a one-item list the caller sets to the exit code (and reads back after the block)."""
    code = [0]
    try:
        yield code
    except SpecPilotError as err:
        report(err)
        code[0] = EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        code[0] = EXIT_INTERRUPTED
    except Exception as err:  # noqa: BLE001 - the catch-all: a defect, reported as one line and logged
        code[0] = EXIT_DEFECT
        path = log_path()
        from specpilot_mem import __version__

        entry = (
            f"### {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')} specpilot-mem {__version__}"
            f" (python {platform.python_version()}, {platform.platform()})\n"
            f"command: specpilot-mem {' '.join(argv)}\n\n{traceback.format_exc()}\n"
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as handle:
                handle.write(entry)
            where = f"the traceback is in {path}"
        except OSError:
            sys.stderr.write(entry)
            where = "the traceback is above (the log could not be written)"
        summary = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        if as_json:
            import json

            sys.stdout.write(
                json.dumps(
                    {"error": "InternalError", "what": summary, "where": where, "fix": "report it with that log"},
                    indent=2,
                )
                + "\n"
            )
        else:
            print(f"error: an unexpected error occurred ({summary}); {where} - please report it", file=sys.stderr)
