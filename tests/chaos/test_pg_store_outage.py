"""One store object through a crash of its PostgreSQL server, call by call.

While the server is down every call raises a transient :class:`StoreUnreachable` (never
psycopg's own error) and stores nothing; once it is back the same store object answers on fresh
connections, without being reopened. Regression: a read snapshot begun on a connection the
crash had dropped raised psycopg's ``OperationalError`` untranslated (the gateway's scheduler
logged it as an unexpected failure); it now begins on a fresh connection.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oncewire import EffectState, Ledger
from oncewire.core.errors import StoreUnreachable
from tests.chaos.conftest import PrivateCluster
from tests.support.claims import settle_and_claim
from tests.support.pg import fresh_schema


@pytest.fixture
def url(pg_cluster: PrivateCluster) -> Iterator[str]:
    if not pg_cluster.running():
        pg_cluster.start()
    with fresh_schema(pg_cluster.url, "chaos_st") as schema_url:
        yield schema_url


def _count(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FROM oncewire_effects").fetchone()
    assert row is not None
    return int(row[0])


def _snapshot_read(ledger: Ledger, key: str) -> object:
    with ledger.store.read_snapshot():
        return ledger.store.get_effect(key)


def test_calls_fail_transient_while_the_server_is_down_and_work_again_after(
    pg_cluster: PrivateCluster, url: str
) -> None:
    with Ledger(url) as ledger:
        ledger.accept("before", "k", {"n": 1})
        with ledger.store.read_snapshot():  # this thread's connection is now idle and open
            assert ledger.store.get_effect("before") is not None
        pg_cluster.crash()
        try:
            calls = {
                "accept": lambda: ledger.accept("during", "k", {"n": 2}),
                "read": lambda: ledger.effects.get("before"),
                "snapshot": lambda: _snapshot_read(ledger, "before"),
                "claim": lambda: settle_and_claim(
                    ledger.store,
                    [],
                    owner="o",
                    now=ledger.clock.now(),
                    lease_seconds=5,
                    limit=5,
                    kinds=None,
                ),
            }
            for name, call in calls.items():
                with pytest.raises(StoreUnreachable) as caught:
                    call()
                assert caught.value.transient, name
        finally:
            pg_cluster.start()

        # The same ledger, without reopening: the first snapshot begins on a fresh connection.
        with ledger.store.read_snapshot():
            before = ledger.store.get_effect("before")
        assert before is not None and before.state is EffectState.PENDING
        ledger.accept("after", "k", {"n": 3})
        assert ledger.effects.get("after").state is EffectState.PENDING

    # Read around oncewire: nothing of the call made while the server was down was stored.
    assert _count(url) == 2
    assert pg_cluster.recovered_from_crash()


def test_a_snapshot_after_a_restart_begins_on_a_fresh_connection(
    pg_cluster: PrivateCluster, url: str
) -> None:
    with Ledger(url) as ledger:
        ledger.accept("k1", "k", {})
        with ledger.store.read_snapshot():
            assert ledger.store.get_effect("k1") is not None
        pg_cluster.crash()
        pg_cluster.start()
        # This thread's connection was dropped while it sat idle: nothing had been read in the
        # snapshot yet, so a fresh connection takes its place instead of an error.
        with ledger.store.read_snapshot():
            effect = ledger.store.get_effect("k1")
        assert effect is not None and effect.key == "k1"
