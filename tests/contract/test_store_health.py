"""``Store.health``: what ``oncewire doctor`` reads, on every backend."""

from __future__ import annotations

import time

from oncewire.storage import Store


def test_health_names_the_backend_and_the_schema(store: Store) -> None:
    facts = store.health()
    assert facts["backend"] == store.dialect
    assert facts["schema_version"] == store.schema_version() >= 1


def test_health_reports_durability_or_server_time(store: Store) -> None:
    facts = store.health()
    if store.dialect == "sqlite":
        assert facts["journal_mode"] == "wal"
        assert facts["synchronous"] == "FULL"
        assert facts["server_time"] is None
    else:
        assert abs(facts["server_time"] - time.time()) < 60
        assert facts["server_version"]
