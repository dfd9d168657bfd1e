"""PostgreSQL's own settings, read around the caller's SQL in a transaction it shares.

The lexer (:mod:`oncewire.storage.sqlguard`) refuses ``SET synchronous_commit = off``, but a
``SELECT set_config('synchronous_commit', 'off', false)`` is a plain query to it, and so is a
function or a ``DO`` block that calls it: the pooled connection then committed every later
transaction without waiting for the disk, and ``set_config('search_path', ...)`` sent
oncewire's own statements to another schema's tables. So the settings oncewire relies on
(:data:`~oncewire.storage.sqlguard.RELIED_ON_SETTINGS`), and what oncewire's table and
function names resolve to (a temporary table named like one of oncewire's is found before the
store's own), are read:

- with the caller's first statement of a transaction, before it, and after each of the caller's
  statements, in the same round trip as the statement (one pipeline): a change is found before
  any statement of oncewire's runs with it;
- once more before the commit, after ``SET CONSTRAINTS ALL IMMEDIATE`` has run what a caller's
  deferred trigger would have run at the commit (one round trip, in transactions where the
  caller ran SQL only).

A change, session-level or local, fails the transaction: every later statement and the commit
are refused and the whole transaction rolls back, which undoes the change with it (PostgreSQL
undoes a ``SET`` of a transaction that rolls back). A transaction in which the caller ran no SQL
reads nothing more.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, TypeVar

from oncewire.core.errors import InvalidState
from oncewire.storage.migrate import fresh_schema
from oncewire.storage.postgres.errors import psycopg
from oncewire.storage.sqlguard import RELIED_ON_SETTINGS

__all__ = ["AT_COMMIT", "SettingsWatch", "changed", "pipelined", "settings_sql"]

T = TypeVar("T")

AT_COMMIT = "SET CONSTRAINTS ALL IMMEDIATE"


@functools.lru_cache(maxsize=1)
def _relations() -> tuple[str, ...]:
    """The tables and sequences of oncewire's schema, as its statements name them."""
    schema = fresh_schema("oncewire.storage.postgres")
    return (
        "oncewire_schema",
        *re.findall(r"CREATE (?:TABLE|SEQUENCE|VIEW) (oncewire_\w+)", schema),
    )


@functools.lru_cache(maxsize=1)
def settings_sql() -> str:
    """One row: each relied-on setting, then what each of oncewire's table names resolves to
    (an array of oids, as text).

    ``current_setting(name, true)`` is NULL for a setting this server does not have
    (``idle_session_timeout`` before PostgreSQL 14). A name resolves through the search_path,
    and through the session's temporary schema before it: a temporary table named
    ``oncewire_effects`` takes the store's place without any setting changing.
    """
    settings = ", ".join(f"pg_catalog.current_setting('{n}', true)" for n in RELIED_ON_SETTINGS)
    regclass = ", ".join(f"pg_catalog.to_regclass('{n}')::oid" for n in _relations())
    return f"SELECT {settings}, ARRAY[{regclass}]::oid[]::text"  # text: one column to load


def changed(before: Any, after: Any) -> tuple[str, str] | None:
    """The first setting or name that differs between two rows of :func:`settings_sql`, and a
    message saying what changed; None when none did."""
    if tuple(before) == tuple(after):
        return None
    count = len(RELIED_ON_SETTINGS)
    what = ""
    for name, was, now in zip(RELIED_ON_SETTINGS, before[:count], after[:count], strict=True):
        if was != now:
            what, setting = f"{name} changed from {was!r} to {now!r}", name
            break
    else:
        was_oids, now_oids = (str(row[count]).strip("{}").split(",") for row in (before, after))
        resolved = zip(_relations(), was_oids, now_oids, strict=True)
        setting = next(name for name, was, now in resolved if was != now)
        what = (
            f"{setting} now names another table (a temporary one, or one in another schema "
            "of the search_path) than the store's own"
        )
    return setting, (
        f"{what} in a transaction shared with oncewire, which its own statements and the "
        "commit rely on; the whole transaction is rolled back (the change with it) and "
        "nothing of it is committed"
    )


class SettingsWatch:
    """What one shared transaction keeps of the settings: ``baseline``, the row read before
    the caller's first statement (None until then: nothing to check), and ``failure``, what
    changed once something did."""

    __slots__ = ("baseline", "failure")

    def __init__(self) -> None:
        self.baseline: Any = None
        self.failure: tuple[str, str] | None = None  # (setting, message)

    def run(self, conn: Any, sql: Any, params: Any) -> Any:
        """The caller's statement on oncewire's connection (``conn.watched``: between two
        reads of the settings, the first only for the baseline); its cursor."""
        cursor, before, after = conn.watched(sql, params, baseline=self.baseline is None)
        if before is not None:
            self.baseline = before.fetchone()
        self.watch(after.fetchone())
        return cursor

    def watch(self, settings: Any) -> None:
        """Fail the transaction if ``settings`` (a row of :func:`settings_sql`) differ from
        the baseline."""
        found = changed(self.baseline, settings)
        if found is not None:
            self.failure = found
            raise self.refusal()

    def refusal(self) -> InvalidState:
        assert self.failure is not None
        setting, message = self.failure
        return InvalidState(message, setting=setting)

    def check_at_commit(self, raw: Any) -> None:
        """The settings once more before the commit, after what a caller's deferred trigger
        would have run at the commit itself (one round trip)."""

        def statements(raw: Any) -> Any:
            raw.execute(AT_COMMIT)
            return raw.execute(settings_sql())

        pipeline = psycopg.Pipeline.is_supported()
        settings = pipelined(raw, statements) if pipeline else statements(raw)
        self.watch(settings.fetchone())


def pipelined(raw: Any, statements: Callable[[Any], T]) -> T:
    """``statements(raw)`` sent in one pipeline (one round trip). A statement's error may be
    raised by the one sent after it, or at the Sync: the first one is raised, never the
    pipeline's own abort after it (nor logged by psycopg as an error it ignored)."""
    failed: BaseException | None = None
    try:
        with raw.pipeline():
            try:
                result = statements(raw)
            except psycopg.Error as exc:
                failed = exc
    except psycopg.Error:
        if failed is None:
            raise
    if failed is not None:
        raise failed
    return result
