"""A read snapshot whose PostgreSQL connection is dropped fails; it never answers from later.

Regression: a read inside ``read_snapshot`` on a connection the server had terminated was run
again on a fresh connection, outside the snapshot, and returned a later moment without an
error; a verified read could then judge a run from two moments.
"""

from __future__ import annotations

import pytest

from oncewire.core.errors import StorageError
from oncewire.storage.postgres import PostgresStore
from tests.support.pg import fresh_schema, server_url


def test_a_dropped_connection_inside_a_snapshot_is_an_error_not_a_later_answer() -> None:
    import psycopg

    with fresh_schema(server_url(), "snap") as url:
        store = PostgresStore(url)
        try:
            with store.read_snapshot():
                assert store.get_effect("k") is None  # the snapshot's moment is taken here
                pid = store.db.conn().info.backend_pid
                other_store = PostgresStore(url)
                try:
                    with other_store.transaction() as tx:
                        other_store.insert_effect_in_tx(
                            tx,
                            key="k",
                            kind="kind",
                            payload_json="{}",
                            digest="d" * 64,
                            max_attempts=3,
                            not_before=0.0,
                            deadline=None,
                            now=0.0,
                        )
                finally:
                    other_store.close()
                with psycopg.connect(url, autocommit=True) as other:
                    other.execute("SELECT pg_terminate_backend(%s)", (pid,))
                with pytest.raises(StorageError) as caught:
                    store.get_effect("k")
                assert caught.value.transient
            # Outside the snapshot, a fresh connection reads the present: the effect is there.
            effect = store.get_effect("k")
            assert effect is not None and effect.key == "k"
        finally:
            store.close()
