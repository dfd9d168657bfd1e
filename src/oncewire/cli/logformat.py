"""``--log-format json``: one JSON object per log line, for the commands that run long.

Each line is ``{"time", "level", "logger", "message", ...}`` plus every attribute the record
was logged with (``extra=``), and ``exception`` with the traceback when there is one. A value
that JSON cannot hold is written as its ``repr``, so a line is never lost to its attributes.
The option is eager: it is read before ``-v`` configures logging, wherever it stands.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import click

__all__ = ["JsonFormatter", "current", "log_format_option"]

FORMATS = ("text", "json")
_format = "text"
# The attributes every LogRecord has: anything else on a record came from extra=.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def current() -> str:
    """The log format chosen for this process: ``text`` or ``json``."""
    return _format


def _chosen(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    global _format
    if value is not None:
        _format = value
    return value


def log_format_option(command: Any) -> Any:
    """The ``--log-format`` option (``ONCEWIRE_LOG_FORMAT``) of a command that runs long."""
    return click.option(
        "--log-format",
        type=click.Choice(FORMATS),
        envvar="ONCEWIRE_LOG_FORMAT",
        show_envvar=True,
        default="text",
        show_default=True,
        is_eager=True,
        expose_value=False,
        callback=_chosen,
        help="How log lines on stderr look: text, or json (one object per line).",
    )(command)


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON (see the module docstring)."""

    def __init__(self, when: Any) -> None:
        super().__init__()
        self._when = when  # the CLI's ISO 8601 time, the same as in text lines

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self._when(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and not name.startswith("_") and name not in line:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        return json.dumps(line, ensure_ascii=False, default=repr)
