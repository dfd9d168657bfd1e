"""Every named query, rendered for the store's dialect, is accepted by the database itself.

``EXPLAIN`` plans a statement without running it, with every parameter bound (NULLs, empty or
one-row lists): a statement that does not parse, names a missing column or mixes types fails
here, before any behaviour test runs it. On PostgreSQL the plan is made from the parameters the
server was sent, as for a prepared statement, inside a transaction that is rolled back. A
``LOCK`` (which EXPLAIN cannot plan) is run instead, in that same transaction.
"""

from __future__ import annotations

import sqlite3

import pytest

from oncewire.storage import Store
from oncewire.storage.sql import queries


def test_every_query_is_accepted_by_the_database(store: Store) -> None:
    rendered = queries(store.dialect).all
    failures: list[str] = []
    if store.dialect == "sqlite":
        conn = sqlite3.connect(store.url, isolation_level=None)
        try:
            for name, query in rendered.items():
                text, params = query.render(query.dummy_params())
                try:
                    conn.execute(f"EXPLAIN {text}", params).fetchall()
                except sqlite3.Error as exc:
                    failures.append(f"{name}: {exc}")
        finally:
            conn.close()
    else:
        psycopg = pytest.importorskip("psycopg")
        with psycopg.connect(store.url) as conn:
            # An {in} list of one value is `= %s`, of any other length `= ANY(%s)`: both forms.
            for name, query, in_length in [(n, q, k) for n, q in rendered.items() for k in (0, 1)]:
                text, params = query.render(query.dummy_params(in_length))
                try:
                    if text.lstrip().upper().startswith("LOCK "):
                        conn.execute(text, params)  # type: ignore[arg-type]
                    else:
                        conn.execute(f"EXPLAIN {text}", params).fetchall()  # type: ignore[arg-type]
                except psycopg.Error as exc:
                    failures.append(f"{name} ({in_length}): {exc}")
                conn.rollback()
    assert not failures, "\n".join(failures)
    assert len(rendered) >= 20
