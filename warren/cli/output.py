"""Rendering: Rich tables and messages on a terminal, JSON when stdout is piped (or with ``--json``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

Column = tuple[str, str | Callable[[Mapping[str, Any]], Any]]
"""A table column: header, and the row key (or a function of the row) that fills it."""


def stdout_is_tty() -> bool:
    return _isatty(sys.stdout)


def stdin_is_tty() -> bool:
    return _isatty(sys.stdin)


def _isatty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


def wants_json(force_json: bool) -> bool:
    """JSON when asked for, or when stdout is not a terminal (piped, redirected, captured)."""
    return force_json or not stdout_is_tty()


def print_json(value: Any) -> None:
    """Plain JSON on stdout: no colours, no wrapping, so pipes get parseable text."""
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


def print_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column], *, empty: str) -> None:
    """Print ``rows`` as a Rich table, or the ``empty`` message when there are none."""
    materialized = list(rows)
    console = Console()
    if not materialized:
        console.print(f"[dim]{escape(empty)}[/dim]")
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for header, _ in columns:
        table.add_column(header)
    for row in materialized:
        table.add_row(*(_cell(row, getter) for _, getter in columns))
    console.print(table)


def print_message(markup: str, *values: object) -> None:
    """A human line on stdout (terminals only): ``markup`` with ``{}`` slots for escaped ``values``."""
    Console().print(markup.format(*(escape(str(v)) for v in values)), highlight=False)


def print_error(message: str) -> None:
    """One red line on stderr."""
    Console(stderr=True).print(f"[bold red]Error:[/bold red] [red]{escape(message)}[/red]", highlight=False)


def print_note(message: str) -> None:
    """A dim hint on stderr, so it never mixes into JSON on stdout."""
    Console(stderr=True).print(f"[dim]{escape(message)}[/dim]", highlight=False)


def _cell(row: Mapping[str, Any], getter: str | Callable[[Mapping[str, Any]], Any]) -> str:
    value = getter(row) if callable(getter) else row.get(getter)
    if value is None:
        return ""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return escape(str(value))
