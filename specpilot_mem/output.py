"""Output for people (rich tables) and for scripts (``--json``), and progress for long work.

Both consoles render no markup: ids, paths, record text and error messages are user data and are shown
exactly as written (``[red]`` or ``[layers, rows]`` included). Styled text is built explicitly with
``styled`` (one style) or ``marked`` (markup whose user parts went through ``escape``). Piped output has
no width limit, so paths are never cut.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console, ConsoleDimensions
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

# wide enough for any path, small enough that nothing is padded to an absurd width
_PIPED_WIDTH = 4000


class _Console(Console):
    """A console with no markup or highlighting whose width, off a terminal, has no practical limit."""

    def __init__(self, stderr: bool = False):
        # no highlighting either: rich's repr highlighter is quadratic in a long value, and user data is
        # not Python reprs
        # soft wrap: a long line is left to the terminal (or the reader of a pipe) instead of being cut
        super().__init__(stderr=stderr, markup=False, highlight=False, soft_wrap=True)

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(_PIPED_WIDTH, size.height)


console = _Console()
err_console = _Console(stderr=True)


def styled(text: str, style: str) -> Text:
    """``text`` as it is (never parsed as markup) in ``style``."""
    return Text(text, style=style)


def marked(markup: str) -> Text:
    """Markup written by this program; every user-given part of it must have gone through ``escape``."""
    return Text.from_markup(markup)


__all__ = ["Text", "console", "emit", "err_console", "escape", "marked", "print_error", "progress", "styled", "table"]


def to_jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "__fspath__"):
        return str(value)
    return value


def emit(args, payload: Any, render: Callable[[Any], None]) -> None:
    """Print ``payload`` as JSON when ``--json`` was given, else hand it to ``render`` for people."""
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(to_jsonable(payload), indent=2, sort_keys=False) + "\n")
    else:
        render(payload)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> Table:
    t = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        t.add_column(column)
    for row in rows:
        t.add_row(*("" if cell is None else cell if isinstance(cell, Text) else str(cell) for cell in row))
    return t


def print_error(err, as_json: bool = False) -> None:
    if as_json:
        sys.stdout.write(json.dumps(err.to_dict(), indent=2) + "\n")
    else:
        err_console.print(Text.assemble(("error:", "bold red"), " ", str(err)), highlight=False)


@contextmanager
def progress(description: str, total: int | None, enabled: bool = True):
    """A rich progress bar on stderr (silent when ``enabled`` is false, e.g. under ``--json``)."""
    if not enabled or not err_console.is_terminal:
        class _Null:
            def advance(self, n: int = 1) -> None:
                pass

            def update(self, **kwargs) -> None:
                pass

        yield _Null()
        return
    with Progress(
        TextColumn("{task.description}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)

        class _Task:
            def advance(self, n: int = 1) -> None:
                bar.advance(task, n)

            def update(self, **kwargs) -> None:
                bar.update(task, **kwargs)

        yield _Task()
