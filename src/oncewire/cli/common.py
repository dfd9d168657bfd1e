"""Options and output helpers shared by the command groups."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

__all__ = ["db_option", "emit", "json_option", "table", "yes_option"]

F = TypeVar("F", bound=Callable[..., Any])


def db_option(fn: F) -> F:
    return click.option(
        "--db",
        "db",
        envvar="ONCEWIRE_DB",
        show_envvar=True,
        required=True,
        metavar="URL_OR_PATH",
        help="The store: a SQLite path, sqlite:///path or postgresql://...",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        fn
    )


def yes_option(fn: F) -> F:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(fn)


def emit(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = min(max(widths[i], len(cell)), 60)
    line = "  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers))
    click.echo(line.rstrip())
    for row in cells:
        click.echo("  ".join(c[: widths[i]].ljust(widths[i]) for i, c in enumerate(row)).rstrip())
