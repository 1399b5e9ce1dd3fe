"""Optional dependencies, imported where they are used: the command line starts without them.

matplotlib (the ``[plot]`` extra) draws the figures, anthropic (``[agents]``) is one agent backend of rounds; a
missing one is a :class:`MissingExtraError` naming the extra that installs it. Standard library only.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from specpilot_mem.errors import SpecPilotError

EXTRAS = {"matplotlib": "plot", "anthropic": "agents"}


class MissingExtraError(SpecPilotError):
    """An optional package that a command needs is not installed."""


def optional_import(module: str, needed_for: str) -> ModuleType:
    """``import module``, or a clear error: what needs it and the ``pip install`` that brings it."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = EXTRAS.get(package)
        fix = f"pip install 'specpilot[{extra}]'" if extra else f"pip install {package}"
        raise MissingExtraError(
            f"{needed_for} needs {package}, which is not installed ({exc})", where=needed_for, fix=fix
        ) from None


def pyplot(needed_for: str) -> ModuleType:
    """matplotlib.pyplot on the file-only Agg backend (figures are written as PNG, never shown)."""
    matplotlib = optional_import("matplotlib", needed_for)
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
