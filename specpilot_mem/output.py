"""Output for people (rich tables) and for scripts (``--json``), and progress for long work.

Both consoles render no markup: ids, paths, record text and error messages are user data and are shown
exactly as written (``[red]`` or ``[layers, rows]`` included). Styled text is built explicitly with
``styled`` (one style), ``assemble`` (plain and styled parts) or ``marked`` (markup whose user parts went
through ``escape``). Piped output has no width limit, so paths are never cut. rich is imported on first
use only (``--help`` and ``--json`` never need it).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

# wide enough for any path, small enough that nothing is padded to an absurd width
_PIPED_WIDTH = 4000


class _LazyConsole:
    """A rich ``Console`` made on first use. Every command module imports the consoles, and importing rich is a
    third of the CLI's start-up, which ``--help``, ``--json`` and most errors never print through."""

    def __init__(self, **options):
        self._options = options
        self._console: Console | None = None

    @property
    def real(self) -> Console:
        if self._console is None:
            self._console = _console_class()(**self._options)
        return self._console

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.real, name, value)


def _console_class() -> type:
    from rich.console import Console, ConsoleDimensions

    class PlainConsole(Console):
        """No markup (user text is shown as written), no repr highlighting (quadratic in a long value, and
        user data is not Python reprs), soft wrap (a long line is left to the terminal or the reader of a
        pipe), and off a terminal, unless COLUMNS or a test set a width, no practical width limit."""

        def __init__(self, **options):
            super().__init__(markup=False, highlight=False, soft_wrap=True, **options)

        @property
        def size(self) -> ConsoleDimensions:
            size = super().size
            return size if self.is_terminal or self._width is not None else ConsoleDimensions(_PIPED_WIDTH, size.height)

        @size.setter
        def size(self, new_size) -> None:
            Console.size.fset(self, new_size)

    return PlainConsole


console = _LazyConsole()
err_console = _LazyConsole(stderr=True)


def escape(text: str) -> str:
    """``text`` made safe to put inside markup (see ``marked``)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def styled(text: str, style: str) -> Text:
    """``text`` as it is (never parsed as markup) in ``style``."""
    from rich.text import Text

    return Text(text, style=style)


def assemble(*parts: str | tuple[str, str]) -> Text:
    """Plain strings and (text, style) pairs joined, none of them parsed as markup."""
    from rich.text import Text

    return Text.assemble(*parts)


def marked(markup: str) -> Text:
    """Markup written by this program; every user-given part of it must have gone through ``escape``."""
    from rich.text import Text

    return Text.from_markup(markup)


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
    from rich.table import Table
    from rich.text import Text

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
        err_console.print(assemble(("error:", "bold red"), " ", str(err)))


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
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console.real,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)

        class _Task:
            def advance(self, n: int = 1) -> None:
                bar.advance(task, n)

            def update(self, **kwargs) -> None:
                bar.update(task, **kwargs)

        yield _Task()
