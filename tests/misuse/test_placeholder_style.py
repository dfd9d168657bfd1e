"""Every transaction oncewire hands the caller takes one placeholder style: ``:name`` with a dict.

``ledger.transaction()`` took ``:name`` on both backends, but also each driver's own style
(``?`` on SQLite, ``%s`` and ``%(name)s`` on PostgreSQL), and the receipts' transactions
(``Receipts.run_once`` and ``run_many``, ``AsyncReceipts``, the ASGI middleware's deferred
writes) were documented with those: code written against one backend silently did not run on
the other. Now every one of them runs ``:name`` with a dict on both backends, and a statement in
one driver's own style is refused before it runs, with an error that names the portable style;
nothing of the transaction is stored. What was stored is read around oncewire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.aio import AsyncLedger, AsyncReceipts, ThreadTransaction
from oncewire.asgi import IdempotencyKeyMiddleware
from oncewire.core.errors import StatementError
from oncewire.receipts import Receipts
from oncewire.storage import Transaction
from tests.contract.conftest import RawDatabase

INSERT = "INSERT INTO notes (id, body) VALUES (:id, :body)"

# Each driver's own style, as code written against that driver alone would pass it.
NATIVE: dict[str, list[tuple[str, Any]]] = {
    "sqlite": [
        ("INSERT INTO notes (id, body) VALUES (?, ?)", (7, "q")),
        ("INSERT INTO notes (id, body) VALUES (?1, ?2)", (7, "q")),
        ("INSERT INTO notes (id, body) VALUES (:id, :body)", (7, "q")),  # named, by position
        ("INSERT INTO notes (id, body) VALUES (?, ?)", {"id": 7, "body": "q"}),
        ("INSERT INTO notes (id, body) VALUES ($id, $body)", {"id": 7, "body": "q"}),
        ("INSERT INTO notes (id, body) VALUES (@id, @body)", {"id": 7, "body": "q"}),
    ],
    "postgresql": [
        ("INSERT INTO notes (id, body) VALUES (%s, %s)", (7, "q")),
        ("INSERT INTO notes (id, body) VALUES (%(id)s, %(body)s)", {"id": 7, "body": "q"}),
        ("INSERT INTO notes (id, body) VALUES (:id, %(body)s)", {"id": 7, "body": "q"}),
        ("INSERT INTO notes (id, body) VALUES (%s, 'q')", {"id": 7}),
        ("INSERT INTO notes (id, body) VALUES ($1, :body)", {"body": "q"}),
        ("INSERT INTO notes (id, body) VALUES (:id, :body)", (7, "q")),
    ],
}


@pytest.fixture
def notes(raw: RawDatabase) -> str:
    raw.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    return "notes"


def _refused(exc: BaseException) -> None:
    assert isinstance(exc, StatementError), repr(exc)
    assert ":name" in str(exc), str(exc)
    assert "nothing" in str(exc), str(exc)
    assert not exc.transient


# -- ledger.transaction() ----------------------------------------------------------------------


def test_a_drivers_own_style_is_refused_in_ledger_transaction(
    ledger: Ledger, raw: RawDatabase, notes: str, backend: str
) -> None:
    for sql, params in NATIVE[backend]:
        with pytest.raises(StatementError) as caught, ledger.transaction() as tx:
            tx.execute(INSERT, {"id": 9, "body": "before"})
            tx.accept("k-1", "send", {"n": 1})
            tx.execute(sql, params)
        _refused(caught.value)
        assert raw.count(notes) == 0, sql
        assert raw.count("oncewire_effects") == 0, sql


def test_the_portable_style_runs_in_ledger_transaction(
    ledger: Ledger, raw: RawDatabase, notes: str
) -> None:
    with ledger.transaction() as tx:
        tx.execute(INSERT, {"id": 1, "body": "50% of :this, ?, $x and @y stay text"})
        # A literal % in a statement with parameters but no placeholder in it.
        tx.execute("UPDATE notes SET body = body || ' 100%' WHERE id = 1", {})
        tx.execute("INSERT INTO notes (id, body) SELECT :id, 'x'", {"id": 2})
        tx.execute("INSERT INTO notes (id, body) VALUES (3, 'no parameters, 5%')")
    assert raw.query("SELECT id, body FROM notes ORDER BY id") == [
        (1, "50% of :this, ?, $x and @y stay text 100%"),
        (2, "x"),
        (3, "no parameters, 5%"),
    ]


def test_a_literal_percent_with_parameters_and_no_placeholder_runs(
    ledger: Ledger, raw: RawDatabase, notes: str
) -> None:
    """psycopg reads every '%' once parameters are given: oncewire escapes it even when the
    statement has no ':name' of its own."""
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO notes (id, body) VALUES (1, '100%')", {"unused": 1})
    assert raw.query("SELECT body FROM notes") == [("100%",)]


# -- Receipts.run_once / run_many -------------------------------------------------------------


def test_receipts_take_the_portable_style_and_refuse_a_drivers_own(
    ledger: Ledger, raw: RawDatabase, notes: str, backend: str
) -> None:
    receipts = Receipts(ledger.store)

    def work(tx: Transaction) -> int:
        tx.execute(INSERT, {"id": 1, "body": "charged"})
        return 1

    assert receipts.run_once("r-1", {"n": 1}, work).result == 1
    for i, (sql, params) in enumerate(NATIVE[backend]):

        def native(tx: Transaction, sql: str = sql, params: Any = params, row: int = i) -> int:
            tx.execute(INSERT, {"id": 100 + row, "body": "before"})
            tx.execute(sql, params)
            return 2

        with pytest.raises(StatementError) as caught:
            receipts.run_once(f"r-native-{i}", {"n": i}, native)
        _refused(caught.value)

    def item(tx: Transaction, key: str, payload: Any) -> str:
        if key == "m-bad":
            sql, params = NATIVE[backend][0]
            tx.execute(sql, params)
        tx.execute(INSERT, {"id": payload["id"], "body": key})
        return key

    results = receipts.run_many([("m-ok", {"id": 50}), ("m-bad", {"id": 51})], item)
    assert not isinstance(results[0], Exception) and results[0].result == "m-ok"
    assert isinstance(results[1], StatementError)
    _refused(results[1])
    assert raw.query("SELECT id, body FROM notes ORDER BY id") == [(1, "charged"), (50, "m-ok")]
    assert sorted(r[0] for r in raw.query("SELECT key FROM oncewire_receipts")) == ["m-ok", "r-1"]


# -- AsyncLedger and AsyncReceipts ------------------------------------------------------------


def test_async_transactions_take_the_portable_style_and_refuse_a_drivers_own(
    store_url: str, raw: RawDatabase, notes: str, backend: str
) -> None:
    sql, params = NATIVE[backend][0]

    async def portable(tx: ThreadTransaction) -> int:
        await tx.execute(INSERT, {"id": 2, "body": "receipt"})
        rows = await tx.execute("SELECT body FROM notes WHERE id = :id", {"id": 2})
        assert rows.fetchall() == [("receipt",)]
        return 2

    async def native(tx: ThreadTransaction) -> int:
        await tx.execute(INSERT, {"id": 3, "body": "before"})
        await tx.execute(sql, params)
        return 3

    async def main() -> None:
        async with AsyncLedger(store_url) as ledger:
            async with ledger.transaction() as tx:
                await tx.execute(INSERT, {"id": 1, "body": "ledger"})
            with pytest.raises(StatementError) as caught:
                async with ledger.transaction() as tx:
                    await tx.execute(INSERT, {"id": 4, "body": "before"})
                    await tx.accept("k-4", "send", {})
                    await tx.execute(sql, params)
            _refused(caught.value)
        async with AsyncReceipts(store_url) as receipts:
            assert (await receipts.run_once("a-2", {}, portable)).result == 2
            with pytest.raises(StatementError) as caught:
                await receipts.run_once("a-3", {}, native)
            _refused(caught.value)

    asyncio.run(main())
    assert raw.query("SELECT id, body FROM notes ORDER BY id") == [(1, "ledger"), (2, "receipt")]
    assert raw.query("SELECT key FROM oncewire_receipts") == [("a-2",)]
    assert raw.count("oncewire_effects") == 0


# -- the ASGI middleware's deferred writes -----------------------------------------------------


async def _post(app: Any, key: str, body: bytes) -> tuple[int, bytes]:
    """One keyed POST through the ASGI app, in process; its status and body."""
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            await asyncio.Event().wait()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/notes",
        "raw_path": b"/notes",
        "query_string": b"",
        "headers": [(b"idempotency-key", key.encode())],
    }
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def _handler(write: Callable[[Transaction], object]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        scope["state"]["idempotency"].write(write)
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"created", "more_body": False})

    return app


def test_the_middlewares_writes_take_the_portable_style_and_refuse_a_drivers_own(
    ledger: Ledger, raw: RawDatabase, notes: str, backend: str
) -> None:
    receipts = Receipts(ledger.store)
    sql, params = NATIVE[backend][0]
    portable = IdempotencyKeyMiddleware(
        _handler(lambda tx: tx.execute(INSERT, {"id": 1, "body": "asgi"})), receipts=receipts
    )
    native = IdempotencyKeyMiddleware(
        _handler(lambda tx: tx.execute(sql, params)), receipts=receipts
    )

    async def main() -> None:
        assert await _post(portable, "h-1", b"{}") == (201, b"created")
        status, _ = await _post(native, "h-2", b"{}")
        assert status == 500  # nothing stored: the key may be retried

    asyncio.run(main())
    assert raw.query("SELECT id, body FROM notes") == [(1, "asgi")]
    assert raw.query("SELECT key FROM oncewire_receipts") == [("h-1",)]


# -- the rules, without a database ---------------------------------------------------------------


def test_the_rendering_rules() -> None:
    from oncewire.storage.sqlguard import caller_statement

    # PostgreSQL: ':name' becomes psycopg's %(name)s, every '%' is doubled once parameters go.
    assert caller_statement("SELECT 1", {}, "postgresql") == ("SELECT 1", None)
    assert caller_statement("SELECT '5%'", (), "postgresql") == ("SELECT '5%'", None)
    assert caller_statement("SELECT '5%', :a", {"a": 1}, "postgresql") == (
        "SELECT '5%%', %(a)s",
        {"a": 1},
    )
    assert caller_statement("SELECT ':x', x::int", {"a": 1}, "postgresql") == (
        "SELECT ':x', x::int",
        {"a": 1},
    )
    assert caller_statement("SELECT a % b, data ? 'k'", {"a": 1}, "postgresql")[0] == (
        "SELECT a %% b, data ? 'k'"  # '?' is jsonb's operator on PostgreSQL, not a placeholder
    )
    # SQLite: the text is SQLite's own, ':name' included.
    assert caller_statement("SELECT :a, '?'", {"a": 1}, "sqlite") == ("SELECT :a, '?'", {"a": 1})
    assert caller_statement("SELECT a % b", None, "sqlite") == ("SELECT a % b", None)
    assert caller_statement('SELECT "?", [@x], `$y`', {}, "sqlite") == (
        'SELECT "?", [@x], `$y`',
        None,
    )
    for dialect in ("sqlite", "postgresql"):
        for sql, params in NATIVE[dialect]:
            with pytest.raises(StatementError) as caught:
                caller_statement(sql, params, dialect)
            _refused(caught.value)
        with pytest.raises(StatementError, match="dict"):
            caller_statement("SELECT 1", "not params", dialect)
