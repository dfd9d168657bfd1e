"""The gateway's looks read what they may start, not the inbox's history (migration 0013).

The scheduler asks at each look for each session's oldest waiting message (``queued_inbound``),
the reply thread for the replies it may deliver and when the next one will be
(``deliverable_replies``, ``next_reply_due``), and a Discord backfill for the newest ids admitted
lately (``newest_inbound_ids``). On a store holding thousands of handled messages and replies
and a few waiting ones, each must read through its index and touch about the rows it returns:
checked in the plans each database makes (PostgreSQL's with the rows it actually read), after
the tables are filled and analyzed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oncewire.storage import Store, open_store
from tests.support.pg import fresh_schema, server_url

HANDLED, WAITING, CHATS = 6000, 12, 40

_INBOUND = (
    "INSERT INTO oncewire_inbound (platform, bot, chat, thread, platform_message_id, payload, "
    "digest, status, created_at, updated_at) VALUES ('tg', 'bot', ?, '', ?, '{}', 'd', ?, ?, ?)"
)
_REPLY = (
    "INSERT INTO oncewire_replies (inbound_id, platform, bot, chat, thread, format, cap, unit, "
    "state, final_text, plan, max_attempts, not_before, created_at, updated_at) "
    "SELECT id, 'tg', 'bot', chat, '', 'plain', 4096, 'utf16', "
    "CASE WHEN status = 'delivered' THEN 'delivered' ELSE 'committed' END, 'x', '[]', 5, 0, 0, 0 "
    "FROM oncewire_inbound WHERE status <> 'received'"
)


def _fill(raw: Any, placeholder: str) -> None:
    rows = [(f"c{n % CHATS}", str(n), "delivered", 0.0, 0.0) for n in range(HANDLED)]
    # A few waiting messages, two per chat in the first chats (the second waits behind the
    # first), and a few answered ones whose replies are still to deliver.
    rows += [(f"c{n % (WAITING // 2)}", f"w{n}", "received", 1e9, 1e9) for n in range(WAITING)]
    rows += [(f"c{n}", f"a{n}", "answered", 1e9, 1e9) for n in range(3)]
    raw.executemany(_INBOUND.replace("?", placeholder), rows)
    raw.execute(_REPLY)


QUERIES: dict[str, dict[str, Any]] = {
    "queued_inbound": {"platforms": ["tg"], "limit": 4},
    "deliverable_replies": {"platforms": ["tg"], "now": 10.0, "limit": 100},
    "next_reply_due": {"platforms": ["tg"]},
    "newest_inbound_ids": {"platform": "tg", "since": 1e9 - 60},
}
INDEXES = {
    "queued_inbound": "oncewire_inbound_received",
    "deliverable_replies": "oncewire_replies_due",
    "next_reply_due": "oncewire_replies_due",
    "newest_inbound_ids": "oncewire_inbound_recent",
}


def test_sqlite_reads_the_gateways_looks_through_their_indexes(tmp_path: Path) -> None:
    import sqlite3

    store = open_store(str(tmp_path / "plans.db"))
    try:
        raw = sqlite3.connect(tmp_path / "plans.db", isolation_level=None)
        _fill(raw, "?")
        raw.execute("ANALYZE")
        for name, params in QUERIES.items():
            text, bound = getattr(store.db.queries, name).render(params)
            rows = raw.execute(f"EXPLAIN QUERY PLAN {text}", bound).fetchall()
            plan = "\n".join(str(row[-1]) for row in rows)
            assert INDEXES[name] in plan, (name, plan)
            assert "SCAN oncewire_" not in plan, (name, plan)  # no table read whole
        raw.close()
        assert len(store.queued_inbound(platforms=["tg"], limit=100)) == WAITING // 2
    finally:
        store.close()


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_postgres_reads_the_gateways_looks_through_their_indexes() -> None:
    import psycopg

    with fresh_schema(server_url(), "queue_plan") as url:
        store: Store = open_store(url)
        try:
            with psycopg.connect(url, autocommit=True) as raw:
                with raw.cursor() as cur:
                    _fill(cur, "%s")
                raw.execute("ANALYZE")
                for name, params in QUERIES.items():
                    text, bound = getattr(store.db.queries, name).render(params)
                    row = raw.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {text}", bound).fetchone()
                    assert row is not None
                    found = row[0] if isinstance(row[0], list) else json.loads(row[0])
                    nodes = list(_nodes(found[0]["Plan"]))
                    scans = [n for n in nodes if "Relation Name" in n]
                    assert scans and all("Index Name" in n for n in scans), (name, nodes)
                    # About the waiting rows, never the handled ones.
                    read = sum(
                        n["Actual Rows"] * n.get("Actual Loops", 1)
                        + n.get("Rows Removed by Filter", 0)
                        for n in scans
                    )
                    assert read <= 4 * WAITING, (name, read, nodes)
        finally:
            store.close()
