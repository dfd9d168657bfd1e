"""Options and output helpers shared by the command groups.

Readers open the store with :func:`open_reader`: as any command does, or, given ``--read-only``
(or when the store turns out to be read-only: a read-only mount, a file or directory this user
may not write), without writing to it. Commands that may create a store take ``--adopt``: a
database that holds other tables is refused unless it is given.

Every time the command line prints, in a table or in ``--json``, goes through :func:`when`: ISO
8601 with milliseconds and an explicit zone (``2026-11-30T11:36:16.123+00:00``), so a reader
never has to guess whether a number is seconds, milliseconds or local time.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from oncewire.core.canonical import loads
from oncewire.core.clock import iso_utc
from oncewire.core.errors import ConfigurationError, InvalidPayload, StoreUnusable
from oncewire.storage import Store, open_store

__all__ = [
    "TIME_FIELDS",
    "adopt_option",
    "configure_logging",
    "db_option",
    "emit",
    "json_option",
    "json_text",
    "open_reader",
    "read_json_argument",
    "read_only_option",
    "stamped",
    "strict_json",
    "table",
    "when",
    "yes_option",
]

F = TypeVar("F", bound=Callable[..., Any])

# Field names that hold a Unix time in the records the command line prints.
TIME_FIELDS = frozenset(
    {
        "abandoned_at",
        "at",
        "closed_at",
        "created_at",
        "deadline",
        "expires_at",
        "finished_at",
        "lease_expires_at",
        "not_before",
        "opened_at",
        "published_at",
        "reconciled_at",
        "server_time",
        "started_at",
        "updated_at",
    }
)


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


def read_only_option(fn: F) -> F:
    return click.option(
        "--read-only",
        is_flag=True,
        help="Open the store without writing to it (never migrated nor switched to WAL), e.g. "
        "to inspect a copy. A SQLite file whose directory cannot take the WAL's -shm is read "
        "as a snapshot (a warning says so). Without it, a read-only store is opened so anyway.",
    )(fn)


def adopt_option(fn: F) -> F:
    return click.option(
        "--adopt",
        is_flag=True,
        help="Let a new store be created in a database that holds other tables (oncewire's "
        "tables beside the application's). Without it such a database is refused unchanged.",
    )(fn)


def open_reader(db: str, read_only: bool) -> Store:
    """The store for a command that only reads it.

    As every command opens it, unless ``read_only``; a store that cannot be opened so because
    it is read-only (a read-only mount, a file or directory this user may not write) is then
    opened read-only, which is all a reader needs.
    """
    if read_only:
        return open_store(db, create=False, read_only=True)
    try:
        return open_store(db, create=False)
    except StoreUnusable as exc:
        if exc.fields.get("reason") != "read_only":
            raise
    return open_store(db, create=False, read_only=True)


def yes_option(fn: F) -> F:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(fn)


def when(ts: float | None) -> str | None:
    """A Unix time as ISO 8601 in UTC with milliseconds and the zone (one that is no date:
    ``"<seconds> (not a date)"``); None stays None."""
    if ts is None:
        return None
    return iso_utc(ts)


def stamped(record: Mapping[str, Any], extra: Iterable[str] = ()) -> dict[str, Any]:
    """``record`` with its time fields (top level only) written by :func:`when`.

    Only the record's own fields: a payload or result is the caller's data and is printed as
    it was stored, whatever its keys are called.
    """
    names = TIME_FIELDS.union(extra)
    return {
        name: when(value)
        if name in names and isinstance(value, int | float) and not isinstance(value, bool)
        else value
        for name, value in record.items()
    }


class _IsoFormatter(logging.Formatter):
    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return when(record.created) or ""


def configure_logging(level: int, fmt: str = "%(asctime)s %(name)s %(message)s") -> None:
    """Log to stderr with :func:`when` times, unless logging was configured already: ``fmt``
    lines, or one JSON object per line under ``--log-format json``."""
    from oncewire.cli import logformat

    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    json_lines = logformat.current() == "json"
    handler.setFormatter(logformat.JsonFormatter(when) if json_lines else _IsoFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(level)


def emit(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))


def json_text(value: Any) -> str:
    """A stored JSON value (a payload, a result) on one line, for a ``show`` command's text."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


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


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            # "Last one wins" would store something the operator did not see on their screen.
            raise InvalidPayload(f"duplicate key {key!r} in a JSON object")
        found[key] = value
    return found


def strict_json(text: str | bytes) -> Any:
    """Parse JSON typed by a person: oncewire's strict rules, and no key twice in an object."""
    value = loads(text)  # NaN, Infinity, overflow and malformed text, with their messages
    # A second pass only to find duplicate keys: ``loads`` already proved the text is valid.
    json.loads(text, object_pairs_hook=_refuse_duplicates)
    return value


def read_json_argument(argument: str, what: str = "payload") -> Any:
    """A JSON argument given inline, as ``@path`` (a file) or as ``-`` (standard input)."""
    if argument == "-":
        text: str | bytes = sys.stdin.buffer.read()
    elif argument.startswith("@"):
        path = Path(argument[1:])
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ConfigurationError(
                f"cannot read the {what} from {str(path)!r}: {exc.strerror or exc}"
            ) from exc
    else:
        text = argument
    return strict_json(text)
