"""Store contract: ``inspect`` (what ``oncewire doctor`` checks) on every backend.

A fresh store writes, passes its integrity check and matches its packaged schema; an index or a
trigger dropped (or a trigger added) around oncewire is named, and the probe itself changes
nothing.
"""

from __future__ import annotations

from oncewire.storage import Store
from oncewire.storage.inspection import WriteProbe

from .conftest import RawDatabase


def _names(store: Store) -> set[tuple[str, str, str]]:
    return {(d.problem, d.kind, d.name) for d in store.inspect().differences}


def test_a_fresh_store_is_writable_intact_and_as_its_schema_file(store: Store) -> None:
    found = store.inspect()
    assert found.write is WriteProbe.OK
    assert found.write_error is None
    assert found.integrity == ()
    assert found.differences == ()
    assert found.objects > 20  # tables, indexes and triggers were really compared


def test_the_write_probe_leaves_nothing_behind(store: Store, raw: RawDatabase) -> None:
    before = raw.query("SELECT version, name, applied_at FROM oncewire_schema ORDER BY version")
    store.inspect()
    assert raw.query("SELECT version, name, applied_at FROM oncewire_schema ORDER BY version") == (
        before
    )


def test_a_dropped_index_and_trigger_are_named(store: Store, raw: RawDatabase) -> None:
    raw.execute("DROP INDEX oncewire_effects_due")
    if store.dialect == "sqlite":
        raw.execute("DROP TRIGGER oncewire_run_events_no_delete")
    else:
        raw.execute("DROP TRIGGER oncewire_run_events_no_delete ON oncewire_run_events")
    assert _names(store) == {
        ("missing", "index", "oncewire_effects_due"),
        ("missing", "trigger", "oncewire_run_events_no_delete"),
    }


def test_a_trigger_added_to_an_oncewire_table_is_extra(store: Store, raw: RawDatabase) -> None:
    if store.dialect == "sqlite":
        raw.execute(
            "CREATE TRIGGER oncewire_sneaky AFTER UPDATE ON oncewire_effects BEGIN SELECT 1; END"
        )
    else:
        raw.execute(
            "CREATE FUNCTION sneaky() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RETURN NEW; END $$"
        )
        raw.execute(
            "CREATE TRIGGER sneaky AFTER UPDATE ON oncewire_effects "
            "FOR EACH ROW EXECUTE FUNCTION sneaky()"
        )
    assert _names(store) == {
        ("extra", "trigger", "oncewire_sneaky" if store.dialect == "sqlite" else "sneaky")
    }


def test_an_application_table_beside_oncewire_is_not_reported(
    store: Store, raw: RawDatabase
) -> None:
    raw.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    raw.execute("CREATE INDEX orders_total ON orders (total)")
    assert store.inspect().differences == ()


def test_a_weakened_object_is_changed(store: Store, raw: RawDatabase) -> None:
    if store.dialect == "sqlite":
        # Same name, another definition: the uniqueness it held is gone.
        raw.execute("DROP INDEX oncewire_reply_ops_one_send")
        raw.execute("CREATE INDEX oncewire_reply_ops_one_send ON oncewire_reply_ops (reply_id)")
        expected = ("changed", "index", "oncewire_reply_ops_one_send")
    else:
        raw.execute("ALTER TABLE oncewire_run_events DISABLE TRIGGER oncewire_run_events_no_update")
        expected = ("changed", "trigger", "oncewire_run_events_no_update")
    assert _names(store) == {expected}
