"""Named SQL, written once and rendered per dialect.

Every statement oncewire runs lives in a ``.sql`` file of this package as a block::

    -- name: get_effect
    -- Any comment lines: what the statement does and why.
    SELECT {effect_columns} FROM oncewire_effects WHERE key = :key

and is rendered for ``sqlite`` or ``postgresql`` by these rules, which are the whole difference
between the dialects (the rest is the same SQL text):

1. ``:name`` is a parameter. Both dialects are rendered to positional placeholders (``?`` and
   ``%s``) bound from keyword arguments in the order they appear; a literal ``%`` is doubled
   for PostgreSQL. ``::`` casts are left alone.
2. ``{in :xs}`` binds a list: ``IN (?, ?, ...)`` on SQLite (one text per length, cached; an
   empty list is ``IN (NULL)``, which matches nothing), ``= ANY(%s)`` on PostgreSQL (one plan).
3. ``{values :rows type, type, ...}`` binds a list of rows as a table: ``VALUES (?, ...), ...``
   on SQLite, padded with rows of NULLs to a power of two so that a few prepared texts serve
   every size, and ``SELECT * FROM unnest(%s::type[], ...)`` on PostgreSQL (one plan, the rows
   sent as one array per column). Use it inside ``WITH v (a, b, ...) AS ({values :rows ...})``.
4. ``TRUE``, ``FALSE`` and ``x OR y`` are plain SQL on both (SQLite reads them since 3.23).
5. ``{for_update}``, ``{for_update_of:e}`` and ``{skip_locked}`` render to nothing on SQLite
   (``BEGIN IMMEDIATE`` already serialises writers) and to ``FOR UPDATE``, ``FOR UPDATE OF e``
   and ``FOR UPDATE SKIP LOCKED`` on PostgreSQL.
6. ``{effect_columns}``, ``{receipt_columns}``, ``{attempt_columns}`` (and ``{inbound_columns}``,
   ``{reply_columns}``, ``{op_columns}``, ``{run_columns}``, ``{event_columns}`` and the other
   run-ledger lists) stand for the column lists the records read
   (:mod:`oncewire.storage.records`, :mod:`oncewire.storage.replies`,
   :mod:`oncewire.storage.runs`); ``{effect_columns:e}`` prefixes an alias.
7. A block of ``postgresql.sql`` headed ``-- name: claim [postgresql]`` replaces the neutral
   ``claim`` on PostgreSQL only. An override with no neutral twin is refused when loading. A
   lock that only PostgreSQL's concurrent writers need (``lock_scope``) is a neutral
   ``SELECT 1`` with its override.

How a verb is written (every verb of the store is, in ``storage/verbs``):

- write each statement once in ``<ledger>.sql`` with ``:name`` parameters and the macros above
  (a dynamic ``WHERE`` becomes optional filters: ``(CAST(:kind AS TEXT) IS NULL OR kind =
  :kind)``, ``(:any_state OR state {in :states})``);
- put a dialect-only form (SKIP LOCKED, ``unnest``, ``FILTER``, a lock) in ``postgresql.sql``
  under the same name with ``[postgresql]``; an execution strategy (a pipeline, a snapshot's
  isolation, a constraint's refusal mapped to a typed error) is the driver's;
- write the verb once in ``storage/verbs/<ledger>.py`` over the store's ``self.db`` (a
  :class:`~oncewire.storage.driver.Driver`): ``self.db.one(conn, Q.name, **params)`` and friends
  (``Q = queries()``); the store classes inherit the verb class;
- ``tests/unit/test_sql_render.py`` and ``tests/contract/test_sql_parses.py`` pick the new
  statements up by themselves.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from oncewire.storage.records import ATTEMPT_COLUMNS, EFFECT_COLUMNS, RECEIPT_COLUMNS
from oncewire.storage.replies import INBOUND_COLUMNS, OP_COLUMNS, REPLY_COLUMNS
from oncewire.storage.runs import (
    ACTION_COLUMNS,
    BARRIER_COLUMNS,
    BRANCH_COLUMNS,
    CHECKPOINT_COLUMNS,
    DELIVERY_COLUMNS,
    EVENT_COLUMNS,
    FINDING_COLUMNS,
    KEY_PIN_COLUMNS,
    PHASE_COLUMNS,
    REPORT_COLUMNS,
    RUN_COLUMNS,
)

__all__ = ["DIALECTS", "Queries", "Query", "QueryError", "dummy_params", "load", "queries"]

DIALECTS = ("sqlite", "postgresql")

_COLUMNS = {
    "effect_columns": EFFECT_COLUMNS,
    "receipt_columns": RECEIPT_COLUMNS,
    "attempt_columns": ATTEMPT_COLUMNS,
    "inbound_columns": INBOUND_COLUMNS,
    "reply_columns": REPLY_COLUMNS,
    "op_columns": OP_COLUMNS,
    "run_columns": RUN_COLUMNS,
    "event_columns": EVENT_COLUMNS,
    "phase_columns": PHASE_COLUMNS,
    "finding_columns": FINDING_COLUMNS,
    "action_columns": ACTION_COLUMNS,
    "branch_columns": BRANCH_COLUMNS,
    "checkpoint_columns": CHECKPOINT_COLUMNS,
    "barrier_columns": BARRIER_COLUMNS,
    "delivery_columns": DELIVERY_COLUMNS,
    "report_columns": REPORT_COLUMNS,
    "key_pin_columns": KEY_PIN_COLUMNS,
}
_LOCKS = {
    "for_update": {"sqlite": "", "postgresql": "FOR UPDATE"},
    "skip_locked": {"sqlite": "", "postgresql": "FOR UPDATE SKIP LOCKED"},
}
_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*(?:\[(\w+)\])?\s*$")
# A macro in braces, or a parameter (not a cast's second colon, not inside a word).
_TOKEN = re.compile(r"\{([^{}]+)\}|(?<![:\w]):(\w+)")
_SETTLE_PAD = (None,) * 64


class QueryError(ValueError):
    """A ``.sql`` file that oncewire cannot use (raised at import, by the loader)."""


@dataclass(frozen=True, slots=True)
class _Slot:
    name: str
    how: str  # "one": a value; "in": a list; "values": rows
    width: int = 0  # columns of a "values" slot


class Query:
    """One named statement rendered for one dialect.

    ``render(params)`` gives the text and the positional parameters for the keyword ``params``.
    A statement without lists has one text, built once; one with lists has one text per shape
    (list lengths), cached.
    """

    __slots__ = (
        "_parts",
        "_scalars",
        "_shapes",
        "_slots",
        "_static",
        "dialect",
        "name",
        "source",
    )

    def __init__(self, name: str, source: str, dialect: str) -> None:
        self.name, self.source, self.dialect = name, source, dialect
        self._parts: list[str | _Slot] = []
        self._slots: list[_Slot] = []
        self._shapes: dict[tuple[int, ...], str] = {}
        text = _expand_columns(source)
        last = 0
        for match in _TOKEN.finditer(text):
            self._parts.append(self._literal(text[last : match.start()]))
            last = match.end()
            if match.group(2) is not None:
                slot = _Slot(match.group(2), "one")
                self._parts.append(slot)
                self._slots.append(slot)
                continue
            macro = match.group(1).strip()
            if macro in _LOCKS:
                self._parts.append(_LOCKS[macro][dialect])
            elif macro.startswith("for_update_of:"):
                alias = macro.partition(":")[2].strip()
                self._parts.append(f"FOR UPDATE OF {alias}" if dialect == "postgresql" else "")
            elif macro.startswith("in :"):
                slot = _Slot(macro[4:].strip(), "in")
                self._parts.append(slot)
                self._slots.append(slot)
            elif macro.startswith("values :"):
                name, _, types = macro[8:].partition(" ")
                columns = [t.strip() for t in types.split(",") if t.strip()]
                if not columns:
                    raise QueryError(f"{name}: {{values :{name}}} names no column types")
                if dialect == "postgresql":
                    self._parts.append(
                        "SELECT * FROM unnest(" + ", ".join(f"%s::{t}[]" for t in columns) + ")"
                    )
                else:
                    self._parts.append(_Slot(name, "values", len(columns)))
                slot = _Slot(name, "values", len(columns))
                self._slots.append(slot)
            else:
                raise QueryError(f"query {name!r}: unknown macro {{{macro}}}")
        self._parts.append(self._literal(text[last:]))
        # The text of a statement whose parameters are all values never changes (on PostgreSQL
        # neither does one with lists: each list is one parameter); it binds with one C call.
        self._static: str | None = None
        self._scalars: Callable[[Mapping[str, Any]], tuple[Any, ...]] | None = None
        if all(slot.how == "one" for slot in self._slots):
            self._scalars = _getter(tuple(slot.name for slot in self._slots))
            self._static = (
                self._sqlite_text(())
                if dialect == "sqlite"
                else "".join(map(self._pg_part, self._parts))
            )
        elif dialect == "postgresql":
            self._static = "".join(map(self._pg_part, self._parts))

    def _literal(self, text: str) -> str:
        return text.replace("%", "%%") if self.dialect == "postgresql" else text

    @staticmethod
    def _pg_part(part: str | _Slot) -> str:
        if isinstance(part, str):
            return part
        return "= ANY(%s)" if part.how == "in" else "%s"

    def dummy_params(self) -> dict[str, Any]:
        """Parameters of the right shape (NULLs, empty or one-row lists) to prepare it with."""
        params: dict[str, Any] = {}
        for slot in self._slots:
            if slot.how == "one":
                params.setdefault(slot.name, None)
            elif slot.how == "in":
                params.setdefault(slot.name, [])
            else:
                params.setdefault(slot.name, [(None,) * slot.width])
        return params

    @property
    def params(self) -> tuple[str, ...]:
        """The parameter names, in order of first appearance."""
        return tuple(dict.fromkeys(slot.name for slot in self._slots))

    def render(self, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        if self._scalars is not None and self._static is not None:
            return self._static, self._scalars(params)
        if self._static is not None:  # PostgreSQL, with lists
            return self._static, self._pg_bind(params)
        return self._sqlite(params)

    def _pg_bind(self, params: Mapping[str, Any]) -> tuple[Any, ...]:
        bound: list[Any] = []
        for slot in self._slots:
            value = params[slot.name]
            if slot.how == "one":
                bound.append(value)
            elif slot.how == "in":
                bound.append(list(value))
            else:  # one array per column
                rows = list(value)
                bound.extend([row[i] for row in rows] for i in range(slot.width))
        return tuple(bound)

    def _sqlite(self, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        shape: list[int] = []
        bound: list[Any] = []
        for slot in self._slots:
            value = params[slot.name]
            if slot.how == "one":
                bound.append(value)
            elif slot.how == "in":
                shape.append(len(value))
                bound.extend(value)
            else:
                size = _padded(len(value))
                shape.append(size)
                for row in value:
                    bound.extend(row)
                missing = slot.width * (size - len(value))
                while missing > 0:
                    pad = _SETTLE_PAD[: min(missing, len(_SETTLE_PAD))]
                    bound.extend(pad)
                    missing -= len(pad)
        key = tuple(shape)
        text = self._shapes.get(key)
        if text is None:
            text = self._shapes[key] = self._sqlite_text(key)
        return text, tuple(bound)

    def _sqlite_text(self, shape: tuple[int, ...]) -> str:
        sizes = iter(shape)
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
            elif part.how == "one":
                out.append("?")
            elif part.how == "in":
                size = next(sizes)
                out.append(f"IN ({', '.join('?' * size)})" if size else "IN (NULL)")
            else:
                row = f"({', '.join('?' * part.width)})"
                out.append("VALUES " + ", ".join([row] * next(sizes)))
        return "".join(out)

    def __repr__(self) -> str:
        return f"Query({self.name!r}, {self.dialect!r})"


def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``params -> (params[name], ...)`` for ``names``, in order."""
    if not names:
        return lambda params: ()
    if len(names) == 1:
        name = names[0]
        return lambda params: (params[name],)
    return operator.itemgetter(*names)


def _padded(rows: int) -> int:
    """The next power of two (at least 1): a handful of texts serve every number of rows."""
    size = 1
    while size < rows:
        size *= 2
    return size


def _expand_columns(text: str) -> str:
    def column_list(match: re.Match[str]) -> str:
        name, _, alias = match.group(1).partition(":")
        columns = _COLUMNS.get(name.strip())
        if columns is None:
            return match.group(0)
        if not alias:
            return columns
        return ", ".join(f"{alias.strip()}.{c}" for c in columns.split(", "))

    return re.sub(r"\{(\w+_columns(?::\w+)?)\}", column_list, text)


class Queries:
    """Every named query of one dialect, as attributes (``Q.get_effect``)."""

    def __init__(self, dialect: str, blocks: Mapping[str, str]) -> None:
        self.dialect = dialect
        self.all: dict[str, Query] = {
            name: Query(name, text, dialect) for name, text in blocks.items()
        }
        for name, query in self.all.items():
            setattr(self, name, query)

    def __getattr__(self, name: str) -> Query:
        raise AttributeError(f"no query named {name!r} in oncewire.storage.sql")


def parse(text: str, origin: str) -> list[tuple[str, str | None, str]]:
    """The ``(name, dialect or None, statement)`` blocks of one file."""
    blocks: list[tuple[str, str | None, str]] = []
    name: str | None = None
    dialect: str | None = None
    lines: list[str] = []

    def close() -> None:
        if name is None:
            return
        body = "\n".join(line for line in lines if not line.lstrip().startswith("--")).strip()
        if not body:
            raise QueryError(f"{origin}: query {name!r} has no statement")
        blocks.append((name, dialect, body.rstrip(";").rstrip()))

    for line in text.splitlines():
        header = _HEADER.match(line.strip())
        if header:
            close()
            name, dialect, lines = header.group(1), header.group(2), []
            if dialect is not None and dialect not in DIALECTS:
                raise QueryError(f"{origin}: query {name!r}: unknown dialect {dialect!r}")
        elif name is not None:
            lines.append(line)
        elif line.strip() and not line.lstrip().startswith("--"):
            raise QueryError(f"{origin}: SQL before the first '-- name:' header")
    close()
    return blocks


def load(dialect: str, files: Mapping[str, str] | None = None) -> Queries:
    """The queries of ``dialect`` from ``files`` (file name -> text; default: this package).

    A name defined twice, an override without a neutral twin, or an override outside
    ``postgresql.sql`` is refused.
    """
    if dialect not in DIALECTS:
        raise QueryError(f"unknown dialect {dialect!r}")
    if files is None:
        files = _package_files()
    neutral: dict[str, str] = {}
    overrides: dict[str, dict[str, str]] = {d: {} for d in DIALECTS}
    for origin, text in sorted(files.items()):
        for name, only, body in parse(text, origin):
            if only is None:
                if origin == "postgresql.sql":
                    raise QueryError(f"{origin}: {name!r} must be marked [postgresql]")
                if name in neutral:
                    raise QueryError(f"{origin}: query {name!r} is defined twice")
                neutral[name] = body
            else:
                if origin != f"{only}.sql":
                    raise QueryError(
                        f"{origin}: the [{only}] override {name!r} belongs in {only}.sql"
                    )
                if name in overrides[only]:
                    raise QueryError(f"{origin}: override {name!r} is defined twice")
                overrides[only][name] = body
    for only, bodies in overrides.items():
        for name in bodies:
            if name not in neutral:
                raise QueryError(f"{only}.sql: override {name!r} has no neutral query to replace")
    return Queries(dialect, {**neutral, **overrides[dialect]})


def _package_files() -> dict[str, str]:
    root = resources.files(__name__)
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in root.iterdir()
        if entry.name.endswith(".sql")
    }


@functools.cache
def queries(dialect: str) -> Queries:
    """The packaged queries of ``dialect``, loaded once per process."""
    return load(dialect)


def dummy_params(query: Query) -> dict[str, Any]:
    """Parameters of the right shape (NULLs, one-row lists) to prepare ``query`` with."""
    return query.dummy_params()
