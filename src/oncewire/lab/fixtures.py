"""What the lab's suites and child processes share: the stores, and reading them directly.

The *caller* store holds the caller's own ``operations`` table beside oncewire's outbox, so that
an operation and its effect are accepted in one transaction. The *downstream* store is the
receiving service: its ``tickets`` table and oncewire's receipts. On SQLite they are two files in
the scenario's folder; on PostgreSQL two schemas of the database given to the lab.

The lab reads both with the plain driver (sqlite3 or psycopg), not through the code under test.
Every name here is public inside the lab: a suite reaches for nothing private in another module.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from oncewire.core import extras
from oncewire.core.errors import ConfigurationError

__all__ = [
    "FIXTURE",
    "KIND",
    "Backend",
    "StorePair",
    "accept_all",
    "claims_held_by",
    "claims_lockable",
    "dialect_of",
    "initialise",
    "placeholders",
    "reading_both",
    "rows",
    "snapshot",
    "terminate_connections",
    "with_search_path",
]

KIND = "ticket"
FIXTURE: dict[str, Any] = {
    "project": "demo-agent",
    "title": "Investigate the synthetic queue backlog",
    "priority": "normal",
}


def dialect_of(url: str) -> str:
    """``postgresql`` for a PostgreSQL URL, ``sqlite`` for anything else (a file)."""
    return "postgresql" if url.startswith(("postgresql:", "postgres:")) else "sqlite"


def placeholders(dialect: str, text: str) -> str:
    """The lab writes ``?`` placeholders; PostgreSQL's driver wants ``%s``."""
    return text.replace("?", "%s") if dialect == "postgresql" else text


def with_search_path(url: str, schema: str, application_name: str | None = None) -> str:
    """``url`` pointed at ``schema`` (libpq options), optionally naming its connections."""
    options = quote(f"-csearch_path={schema}")
    extra = f"options={options}"
    if application_name:
        extra += f"&application_name={quote(application_name)}"
    return url + ("&" if "?" in url else "?") + extra


@dataclass(frozen=True)
class StorePair:
    """Where one scenario's caller and downstream stores live."""

    dialect: str  # "sqlite" or "postgresql"
    caller: str
    downstream: str
    schemas: tuple[str, ...] = ()

    def args(self) -> list[str]:
        return ["--caller", self.caller, "--downstream", self.downstream]

    def sql(self, text: str) -> str:
        """``text`` with this pair's placeholders (the lab writes ``?``)."""
        return placeholders(self.dialect, text)


@dataclass(frozen=True)
class Backend:
    """``sqlite`` (files under the lab's folder) or ``postgresql`` (schemas in ``url``)."""

    name: str = "sqlite"
    url: str | None = None
    run_id: str = "lab"

    def __post_init__(self) -> None:
        if self.name not in ("sqlite", "postgresql"):
            raise ConfigurationError(f"unknown backend {self.name!r} (sqlite or postgresql)")
        if self.name == "postgresql" and not (self.url or "").startswith(
            ("postgresql://", "postgres://")
        ):
            raise ConfigurationError("--backend postgresql needs --db postgresql://...")
        if self.name == "postgresql":
            extras.require("postgres", "the lab on PostgreSQL")

    def pair(self, folder: Path) -> StorePair:
        if self.name == "sqlite":
            return StorePair(
                "sqlite", str(folder / "caller.sqlite"), str(folder / "downstream.sqlite")
            )
        assert self.url is not None
        tag = hashlib.sha256(str(folder).encode()).hexdigest()[:10]
        caller, downstream = f"oncewire_lab_{tag}_c", f"oncewire_lab_{tag}_d"
        _pg_execute(self.url, f"CREATE SCHEMA {caller}", f"CREATE SCHEMA {downstream}")
        (folder / "schemas.txt").write_text(f"{caller}\n{downstream}\n", encoding="utf-8")
        name = f"oncewire-lab-{self.run_id}"
        return StorePair(
            "postgresql",
            with_search_path(self.url, caller, name),
            with_search_path(self.url, downstream, name),
            (caller, downstream),
        )

    def drop(self, pair: StorePair) -> None:
        if self.name == "postgresql" and self.url and pair.schemas:
            _pg_execute(self.url, *(f"DROP SCHEMA IF EXISTS {s} CASCADE" for s in pair.schemas))


def _pg_execute(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def initialise(pair: StorePair) -> None:
    """Create both stores with their schemas."""
    from oncewire.ledger import Ledger  # here, not at the top: children import this module
    from oncewire.receipts import Receipts  # for its names, and should not pay for these

    serial = "BIGSERIAL" if pair.dialect == "postgresql" else "INTEGER"
    with Ledger(pair.caller) as ledger, ledger.transaction() as tx:
        tx.execute(
            "CREATE TABLE operations (id TEXT PRIMARY KEY, payload TEXT NOT NULL, "
            "created_by INTEGER NOT NULL)"
        )
    with Receipts(pair.downstream) as receipts, receipts.store.transaction() as tx:
        tx.execute(
            f"CREATE TABLE tickets (id {serial} PRIMARY KEY, operation_id TEXT NOT NULL, "
            "payload TEXT NOT NULL, attempt INTEGER NOT NULL, redelivery INTEGER NOT NULL, "
            "service_pid INTEGER NOT NULL)"
        )


def rows(dialect: str, where: str, sql: str) -> list[dict[str, Any]]:
    """Every row of ``sql`` as a dict, read with the plain driver (read-only on SQLite)."""
    if dialect == "postgresql":
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(where, autocommit=True, row_factory=dict_row) as conn:
            return [dict(row) for row in conn.execute(sql)]
    with closing(sqlite3.connect(f"file:{where}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        return [dict(row) for row in db.execute(sql)]


@contextmanager
def reading_both(pair: StorePair) -> Iterator[Callable[[str], list[dict[str, Any]]]]:
    """One read-only connection that sees both stores, as ``query(sql) -> rows``.

    In ``sql``, ``{c}`` prefixes a table of the caller's store and ``{d}`` one of the
    downstream store (``{c}oncewire_effects``, ``{d}tickets``), so an invariant over both is one
    set-based statement: for 10,000 keys a join, not 10,000 look-ups. On SQLite the downstream
    file is attached read-only; on PostgreSQL both are schemas of one database. Each statement
    sees what was committed before it (autocommit), so a poll can reuse the connection.
    """
    if pair.dialect == "postgresql":
        import psycopg
        from psycopg.rows import dict_row

        caller, downstream = pair.schemas
        with psycopg.connect(pair.caller, autocommit=True, row_factory=dict_row) as conn:

            def query_pg(sql: str) -> list[dict[str, Any]]:
                text = sql.format(c=f"{caller}.", d=f"{downstream}.")
                return [dict(row) for row in conn.execute(text)]

            yield query_pg
        return
    with closing(
        sqlite3.connect(f"file:{pair.caller}?mode=ro", uri=True, isolation_level=None)
    ) as db:
        db.row_factory = sqlite3.Row
        db.execute("ATTACH DATABASE ? AS d", (f"file:{pair.downstream}?mode=ro",))

        def query_sqlite(sql: str) -> list[dict[str, Any]]:
            return [dict(row) for row in db.execute(sql.format(c="main.", d="d."))]

        yield query_sqlite


def snapshot(pair: StorePair) -> dict[str, list[dict[str, Any]]]:
    effects = rows(
        pair.dialect,
        pair.caller,
        "SELECT key, state, attempts, maybe_sent, fence, lease_owner, result, last_error "
        "FROM oncewire_effects ORDER BY key",
    )
    for effect in effects:
        effect["maybe_sent"] = int(effect["maybe_sent"])
    return {
        "operations": rows(
            pair.dialect, pair.caller, "SELECT id, payload FROM operations ORDER BY id"
        ),
        "effects": effects,
        "tickets": rows(
            pair.dialect,
            pair.downstream,
            "SELECT id, operation_id, payload, attempt, redelivery FROM tickets ORDER BY id",
        ),
        "receipts": rows(
            pair.dialect,
            pair.downstream,
            "SELECT key, digest, result FROM oncewire_receipts ORDER BY key",
        ),
    }


def claims_held_by(pair: StorePair, pid: int) -> int:
    """How many effects a worker process holds claimed right now (read around oncewire)."""
    found = rows(
        pair.dialect,
        pair.caller,
        "SELECT COUNT(*) AS n FROM oncewire_effects WHERE state = 'claimed' "
        f"AND lease_owner LIKE '%:{int(pid)}:%'",
    )
    return int(found[0]["n"])


def claims_lockable(pair: StorePair, pid: int, *, timeout_seconds: float = 0.3) -> bool:
    """Whether a peer could take over the claims of a (stopped) worker process right now: it
    holds no lock that a release of its claims would wait for. A process stopped inside a write
    transaction holds SQLite's one write lock, or on PostgreSQL the row locks of the effects it
    was settling: nobody can release its claims until it runs again, so its lease running out
    changes nothing. Waits up to ``timeout_seconds`` for a lock a live peer holds briefly."""
    if pair.dialect == "postgresql":
        import psycopg

        with psycopg.connect(pair.caller) as conn:
            conn.execute(f"SET LOCAL lock_timeout = '{int(timeout_seconds * 1000)}ms'")
            try:
                conn.execute(
                    "SELECT id FROM oncewire_effects WHERE state = 'claimed' "
                    "AND lease_owner LIKE %s FOR UPDATE",
                    (f"%:{int(pid)}:%",),
                ).fetchall()
            except psycopg.errors.LockNotAvailable:
                return False
            finally:
                conn.rollback()
        return True
    with closing(sqlite3.connect(pair.caller, timeout=timeout_seconds, isolation_level=None)) as db:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return False
        db.execute("ROLLBACK")
    return True


def terminate_connections(url: str, application_name: str) -> int:
    """pg_terminate_backend every connection that names itself ``application_name``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        killed = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchall()
    return sum(1 for row in killed if row[0])


def accept_all(pair: StorePair, operations: int, first: int = 0) -> list[str]:
    """Accept ``operations`` effects (with their operation rows), 50 per transaction."""
    from oncewire.ledger import Ledger

    keys = [f"op-{i:05d}" for i in range(first, first + operations)]
    with Ledger(pair.caller) as ledger:
        for start in range(0, operations, 50):
            with ledger.transaction() as tx:
                for key in keys[start : start + 50]:
                    payload = {**FIXTURE, "title": f"{FIXTURE['title']} #{key}"}
                    tx.execute(
                        "INSERT INTO operations (id, payload, created_by) VALUES (:id, :p, 0)",
                        {"id": key, "p": str(payload)},
                    )
                    tx.accept(key, KIND, payload, max_attempts=25)
    return keys
