"""What ``oncewire doctor`` asks a store about itself, beyond its rows.

Each backend answers with an :class:`Inspection`: can a write transaction begin (and be rolled
back), does the backend's own integrity check pass, and do the tables, indexes, triggers and
functions in the database match the ones its packaged ``schema.sql`` creates. The inspection
only reads: the write probe changes nothing and is always rolled back.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Inspection", "SchemaDifference", "WriteProbe", "schema_names"]


class WriteProbe(enum.StrEnum):
    OK = "ok"  # a write transaction began and was rolled back
    REFUSED = "refused"  # the database refused to write (read-only file, role or server)
    BUSY = "busy"  # another writer held the lock for the whole busy timeout: cannot tell


@dataclass(frozen=True, slots=True)
class SchemaDifference:
    """One object that is not as ``schema.sql`` creates it."""

    kind: str  # table, index, trigger, function
    name: str
    problem: str  # missing, extra, changed
    detail: str = ""

    def describe(self) -> str:
        text = f"{self.problem} {self.kind} {self.name}"
        return f"{text} ({self.detail})" if self.detail else text

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "problem": self.problem,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class Inspection:
    write: WriteProbe
    write_error: str | None  # what the database said when it refused or stayed busy
    integrity: tuple[str, ...] | None  # problems the backend's own check found; None: no check
    integrity_check: str  # what was run (e.g. "PRAGMA quick_check")
    objects: int  # how many schema objects were compared
    differences: tuple[SchemaDifference, ...]


_COMMENT = re.compile(r"--[^\n]*")
_CREATE = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:UNIQUE\s+)?(TABLE|INDEX|TRIGGER|FUNCTION|SEQUENCE)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?(\w+)",
    re.IGNORECASE,
)


def schema_names(script: str) -> dict[tuple[str, str], str]:
    """``(kind, name) -> statement text`` for every object a schema script creates.

    Function bodies are skipped as text (a ``$$ ... $$`` body may itself say CREATE).
    """
    text = _COMMENT.sub("", script)
    text = re.sub(r"\$\$.*?\$\$", "$$ $$", text, flags=re.DOTALL)
    found: dict[tuple[str, str], str] = {}
    matches = list(_CREATE.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        found[(match.group(1).lower(), match.group(2))] = text[match.start() : end].strip()
    return found
