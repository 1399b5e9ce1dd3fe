"""Output for people (rich tables) and for scripts (``--json``), and progress for long work."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class _LazyConsole:
    """A rich ``Console`` made on first use. Every command module imports the consoles, and importing rich is a
    third of the CLI's start-up, which ``--help``, ``--json`` and most errors never print through."""

    def __init__(self, **options):
        self._options = options
        self._console: Console | None = None

    @property
    def real(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self.real, name, value)


console = _LazyConsole()
err_console = _LazyConsole(stderr=True)


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

    t = Table(title=title, show_lines=False, header_style="bold")
    for column in columns:
        t.add_column(column)
    for row in rows:
        t.add_row(*("" if cell is None else str(cell) for cell in row))
    return t


def print_error(err, as_json: bool = False) -> None:
    if as_json:
        sys.stdout.write(json.dumps(err.to_dict(), indent=2) + "\n")
    else:
        err_console.print(f"[bold red]error:[/] {err}", highlight=False, markup=True)


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
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console.real, transient=True,
    ) as bar:
        task = bar.add_task(description, total=total)

        class _Task:
            def advance(self, n: int = 1) -> None:
                bar.advance(task, n)

            def update(self, **kwargs) -> None:
                bar.update(task, **kwargs)

        yield _Task()
