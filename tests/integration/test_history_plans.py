"""The history reads use their indexes on both backends (migration 0011).

A gateway turn reads its session's earlier messages (``session_history``) and the dashboard the
attempts closed lately (``recent_attempts``). On a store with many chats and a long attempt
history, both must read the rows they return through an index, not every message or every
attempt, and not sort them afterwards. Checked in the plans each database makes for the
statements as rendered, after the tables are filled and analyzed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oncewire.storage import Store, open_store
from tests.support.pg import fresh_schema, server_url

CHATS, PER_CHAT, LONG_CHAT, ATTEMPTS = 50, 40, 3000, 4000
HISTORY = {
    "platform": "tg",
    "bot": "bot",
    "chat": "long",
    "thread": "",
    "statuses": ["answered", "delivered", "superseded", "merged"],
    "limit": 20,
}

_FILL_INBOUND = (
    "INSERT INTO oncewire_inbound (platform, bot, chat, thread, platform_message_id, payload, "
    "digest, status, created_at, updated_at) VALUES "
    "('tg', 'bot', ?, '', ?, '{}', 'd', 'answered', 0, 0)"
)


def _fill(store: Store, raw: Any, placeholder: str) -> None:
    sql = _FILL_INBOUND.replace("?", placeholder)
    rows = [(f"c{n % CHATS}", f"m{n}") for n in range(CHATS * PER_CHAT)]
    rows += [("long", f"l{n}") for n in range(LONG_CHAT)]  # the newest message asks
    raw.executemany(sql, rows)
    effect = raw.execute(
        "INSERT INTO oncewire_effects (key, kind, payload, digest, state, attempts, max_attempts, "
        "not_before, fence, created_at, updated_at) VALUES ('k', 'x', '{}', 'd', 'done', 1, 5, "
        "0, 1, 0, 0) RETURNING id"
    ).fetchone()[0]
    raw.executemany(
        "INSERT INTO oncewire_attempts (effect_id, fence, attempt, outcome, state, finished_at) "
        f"VALUES ({placeholder}, {placeholder}, 1, 'done', 'done', {placeholder})",
        [(effect, n, float(n)) for n in range(ATTEMPTS)],
    )


def test_sqlite_reads_the_history_through_its_indexes(tmp_path: Path) -> None:
    import sqlite3

    store = open_store(str(tmp_path / "plans.db"))
    try:
        raw = sqlite3.connect(tmp_path / "plans.db", isolation_level=None)
        _fill(store, raw, "?")
        raw.execute("ANALYZE")
        asking = raw.execute("SELECT MAX(id) FROM oncewire_inbound").fetchone()[0]

        def plan(name: str, **params: Any) -> str:
            text, bound = getattr(store.db.queries, name).render(params)
            rows = raw.execute(f"EXPLAIN QUERY PLAN {text}", bound).fetchall()
            return "\n".join(str(row[-1]) for row in rows)

        history = plan("session_history", before_id=asking, **HISTORY)
        assert "oncewire_inbound_session" in history, history
        assert "TEMP B-TREE" not in history, history  # walked in order: stops after limit
        recent = plan("recent_attempts", since=ATTEMPTS - 60.0, limit=100)
        assert "oncewire_attempts_finished" in recent, recent
        assert "TEMP B-TREE" not in recent, recent
        raw.close()
    finally:
        store.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_postgres_reads_the_history_through_its_indexes() -> None:
    import psycopg

    with fresh_schema(server_url(), "history_plan") as url:
        store = open_store(url)
        try:
            with psycopg.connect(url, autocommit=True) as raw:
                with raw.cursor() as cur:
                    _fill(store, cur, "%s")
                raw.execute("ANALYZE")
                asking = raw.execute("SELECT MAX(id) FROM oncewire_inbound").fetchone()
                assert asking is not None

                def plan(name: str, **params: Any) -> list[dict[str, Any]]:
                    text, bound = getattr(store.db.queries, name).render(params)
                    row = raw.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}", bound).fetchone()
                    assert row is not None
                    found = row[0] if isinstance(row[0], list) else json.loads(row[0])
                    return list(_nodes(found[0]["Plan"]))

                # The newest message of the long chat (most of the store: the primary key
                # walked backwards serves it) and of a short one (its session index does): each
                # reads about the 20 rows it returns, not the chat's or the store's messages.
                short = raw.execute("SELECT MAX(id) FROM oncewire_inbound WHERE chat = 'c7'")
                for chat, before in (("long", asking[0]), ("c7", short.fetchone()[0])):
                    history = plan(
                        "session_history", **{**HISTORY, "chat": chat, "before_id": before}
                    )
                    (earlier,) = [
                        n for n in history if n.get("Relation Name") == "oncewire_inbound"
                    ]
                    assert "Index Name" in earlier, history
                    assert earlier["Actual Rows"] == HISTORY["limit"], earlier
                    assert earlier.get("Rows Removed by Filter", 0) <= HISTORY["limit"], earlier
                recent = plan("recent_attempts", since=ATTEMPTS - 60.0, limit=100)
                (attempts,) = [n for n in recent if n.get("Relation Name") == "oncewire_attempts"]
                assert attempts.get("Index Name") == "oncewire_attempts_finished", recent
                assert attempts["Actual Rows"] == 60, attempts  # the last minute's
        finally:
            store.close()
