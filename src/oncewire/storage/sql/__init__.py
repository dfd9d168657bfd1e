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
   empty list is ``IN (NULL)``, which matches nothing), ``= ANY(%s)`` on PostgreSQL, and
   ``= %s`` there for a list of one. A prepared statement keeps the plan PostgreSQL made at its
   sixth run, and in a plan made for ``= ANY`` of an array of unknown length it prefers to
   filter what a leading column finds over looking each value up (10 values, it assumes): made
   while the tables were new, such a plan reads a whole run's actions to check one id.
   ``= %s`` is looked up in every plan.
3. ``{values :rows type, type, ...}`` binds a list of rows as a table: ``VALUES (?, ...), ...``
   on SQLite, padded with rows of NULLs to a power of two so that a few prepared texts serve
   every size, and ``SELECT * FROM unnest(%s::type[], ...)`` on PostgreSQL (one plan, the rows
   sent as one array per column). Use it inside ``WITH v (a, b, ...) AS ({values :rows ...})``.
4. ``TRUE``, ``FALSE`` and ``x OR y`` are plain SQL on both (SQLite reads them since 3.23).
5. ``{for_update}``, ``{for_update_of:e}`` and ``{skip_locked}`` render to nothing on SQLite
   (``BEGIN IMMEDIATE`` already serialises writers) and to ``FOR UPDATE``, ``FOR UPDATE OF e``
   and ``FOR UPDATE SKIP LOCKED`` on PostgreSQL.
6. ``{x_columns}`` stands for the column list ``X_COLUMNS`` that the records read, from
   :mod:`oncewire.storage.records`, :mod:`oncewire.storage.replies` or
   :mod:`oncewire.storage.runs` (``{effect_columns}``, ``{reply_columns}``, ``{run_columns}``,
   ...); ``{effect_columns:e}`` prefixes an alias.
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
  (``Q = self.db.queries``); the Store inherits the verb class;
- ``tests/unit/test_sql_render.py`` and ``tests/contract/test_sql_parses.py`` pick the new
  statements up by themselves.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncewire.storage import records, replies, runs

__all__ = ["DIALECTS", "Queries", "Query", "QueryError", "load", "queries"]

DIALECTS = ("sqlite", "postgresql")

_RECORDS = (records, replies, runs)  # where ``{x_columns}`` finds ``X_COLUMNS``
_LOCKS = {
    "for_update": "FOR UPDATE",
    "for_update_of": "FOR UPDATE OF",
    "skip_locked": "FOR UPDATE SKIP LOCKED",
}
_HEADER = re.compile(r"^--\s*name:\s*(\w+)\s*(?:\[(\w+)\])?\s*$")
# A macro in braces, or a parameter (not a cast's second colon, not inside a word).
_TOKEN = re.compile(r"\{([^{}]+)\}|(?<![:\w]):(\w+)")


class QueryError(ValueError):
    """A ``.sql`` file that oncewire cannot use (raised at import, by the loader)."""


@dataclass(frozen=True, slots=True)
class _Slot:
    name: str
    how: str  # "one": a value; "in": a list; "values": rows
    types: tuple[str, ...] = ()  # the column types of a "values" slot


class Query:
    """One named statement rendered for one dialect.

    ``render(params)`` gives the text and the positional parameters for the keyword ``params``.
    The text is built once, except on SQLite for a statement with lists, which has one text per
    shape (list lengths), cached.
    """

    __slots__ = ("_fast", "_parts", "_shapes", "_slots", "_text", "dialect", "name")

    def __init__(self, name: str, source: str, dialect: str) -> None:
        self.name, self.dialect = name, dialect
        pg = dialect == "postgresql"
        self._parts: list[str | _Slot] = []
        self._shapes: dict[tuple[int, ...], str] = {}
        last = 0
        for match in _TOKEN.finditer(source):
            self._parts.append(_literal(source[last : match.start()], pg))
            last = match.end()
            if match.group(2) is not None:
                self._parts.append(_Slot(match.group(2), "one"))
            else:
                self._parts.append(_macro(name, match.group(1).strip(), pg))
        self._parts.append(_literal(source[last:], pg))
        self._slots = [part for part in self._parts if isinstance(part, _Slot)]
        lists = any(slot.how != "one" for slot in self._slots)
        # The text never changes unless SQLite expands a list in it, or a PostgreSQL {in} list
        # has one value (a list is one parameter there); a statement whose parameters are all
        # values binds with one C call.
        shaped = not pg or any(slot.how == "in" for slot in self._slots)
        self._text: str | None = None if lists and shaped else self._build(())
        self._fast: tuple[str, Callable[[Mapping[str, Any]], tuple[Any, ...]]] | None = None
        if self._text is not None and not lists:
            self._fast = (self._text, _getter(tuple(slot.name for slot in self._slots)))

    def dummy_params(self, in_length: int = 0) -> dict[str, Any]:
        """Parameters of the right shape (NULLs, ``{in}`` lists of ``in_length`` NULLs, one-row
        lists) to prepare it with."""
        params: dict[str, Any] = {}
        for slot in self._slots:
            listed = [None] * in_length if slot.how == "in" else [(None,) * len(slot.types)]
            params[slot.name] = None if slot.how == "one" else listed
        return params

    def render(self, params: Mapping[str, Any]) -> tuple[str, tuple[Any, ...]]:
        fast = self._fast
        if fast is not None:
            return fast[0], fast[1](params)
        pg = self.dialect == "postgresql"
        shape: list[int] = []
        bound: list[Any] = []
        for slot in self._slots:
            value = params[slot.name]
            if slot.how == "one":
                bound.append(value)
            elif pg and slot.how == "in":
                values = list(value)
                shape.append(int(len(values) == 1))
                bound.append(values[0] if len(values) == 1 else values)
            elif pg:  # one array per column
                rows = list(value)
                bound.extend([row[i] for row in rows] for i in range(len(slot.types)))
            elif slot.how == "in":
                shape.append(len(value))
                bound.extend(value)
            else:  # padded with rows of NULLs
                size = _padded(len(value))
                shape.append(size)
                for row in value:
                    bound.extend(row)
                bound.extend([None] * (len(slot.types) * (size - len(value))))
        text = self._text
        if text is None:
            key = tuple(shape)
            text = self._shapes.get(key)
            if text is None:
                text = self._shapes[key] = self._build(key)
        return text, tuple(bound)

    def _build(self, shape: tuple[int, ...]) -> str:
        """The text for list lengths ``shape`` (SQLite), or for which ``{in}`` lists hold one
        value (PostgreSQL)."""
        pg = self.dialect == "postgresql"
        sizes = iter(shape)
        out: list[str] = []
        for part in self._parts:
            if isinstance(part, str):
                out.append(part)
            elif part.how == "one":
                out.append("%s" if pg else "?")
            elif part.how == "in" and pg:
                out.append("= %s" if next(sizes) else "= ANY(%s)")
            elif part.how == "in":
                size = next(sizes)
                out.append(f"IN ({', '.join('?' * size)})" if size else "IN (NULL)")
            elif pg:
                out.append(f"SELECT * FROM unnest({', '.join(f'%s::{t}[]' for t in part.types)})")
            else:
                row = f"({', '.join('?' * len(part.types))})"
                out.append("VALUES " + ", ".join([row] * next(sizes)))
        return "".join(out)

    def __repr__(self) -> str:
        return f"Query({self.name!r}, {self.dialect!r})"


def _literal(text: str, pg: bool) -> str:
    return text.replace("%", "%%") if pg else text


def _macro(query: str, macro: str, pg: bool) -> str | _Slot:
    """What ``{macro}`` stands for: a list or rows slot, a lock, a column list."""
    if macro.startswith("in :"):
        return _Slot(macro[4:].strip(), "in")
    if macro.startswith("values :"):
        name, _, types = macro[8:].partition(" ")
        typed = tuple(t.strip() for t in types.split(",") if t.strip())
        if not typed:
            raise QueryError(f"{query}: {{values :{name}}} names no column types")
        return _Slot(name, "values", typed)
    word, _, alias = (part.strip() for part in macro.partition(":"))
    if word in _LOCKS:
        return (f"{_LOCKS[word]} {alias}".rstrip()) if pg else ""
    columns = _columns(word) if word.endswith("_columns") else None
    if columns is None:
        raise QueryError(f"query {query!r}: unknown macro {{{macro}}}")
    return ", ".join(f"{alias}.{c}" for c in columns.split(", ")) if alias else columns


def _columns(macro: str) -> str | None:
    """``{effect_columns}``: ``EFFECT_COLUMNS`` of the record modules."""
    for module in _RECORDS:
        columns = getattr(module, macro.upper(), None)
        if isinstance(columns, str):
            return columns
    return None


def _getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """``params -> (params[name], ...)`` for ``names``, in order."""
    if len(names) == 1:
        name = names[0]
        return lambda params: (params[name],)
    return operator.itemgetter(*names) if names else lambda params: ()


def _padded(rows: int) -> int:
    """The next power of two (at least 1): a handful of texts serve every number of rows."""
    size = 1
    while size < rows:
        size *= 2
    return size


class Queries:
    """Every named query of one dialect, as attributes (``Q.get_effect``).

    With ``lazy``, a query is rendered the first time it is asked for. A process that opens a
    store runs a handful of the statements, and a short-lived one (a command, a worker the lab
    starts by the hundred) should not render them all; the packaged queries are loaded this way
    (:func:`queries`), and the test suite renders every one of them. :func:`load` given files
    renders eagerly, so that what it is given is checked whole before it is used.
    """

    def __init__(self, dialect: str, blocks: Mapping[str, str], *, lazy: bool = False) -> None:
        self.dialect = dialect
        self._blocks = dict(blocks)
        if not lazy:
            for name in self._blocks:
                getattr(self, name)

    @property
    def all(self) -> dict[str, Query]:
        """Every query, by name (rendering those not rendered yet)."""
        return {name: getattr(self, name) for name in self._blocks}

    def __getattr__(self, name: str) -> Query:
        # Called only for a name not yet set: render it once, then it is a plain attribute.
        text = self.__dict__.get("_blocks", {}).get(name)
        if text is None:
            raise AttributeError(f"no query named {name!r} in oncewire.storage.sql")
        query = Query(name, text, self.dialect)
        setattr(self, name, query)
        return query


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


def load(dialect: str, files: Mapping[str, str] | None = None, *, lazy: bool = False) -> Queries:
    """The queries of ``dialect`` from ``files`` (file name -> text; default: this package).

    A name defined twice, an override without a neutral twin, or an override outside
    ``postgresql.sql`` is refused; so is a statement that does not render (an unknown macro),
    unless ``lazy`` defers rendering each one to its first use.
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
    return Queries(dialect, {**neutral, **overrides[dialect]}, lazy=lazy)


def _package_files() -> dict[str, str]:
    root = Path(__file__).parent  # the package is files on disk (a wheel is unpacked)
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in root.iterdir()
        if entry.name.endswith(".sql")
    }


@functools.cache
def queries(dialect: str) -> Queries:
    """The packaged queries of ``dialect``, loaded once per process, each rendered on first use."""
    return load(dialect, lazy=True)
