"""A dispatcher given something other than a ledger, on both backends.

Regression: ``Dispatcher("s.db", sinks)`` was accepted, and failed later, far from the mistake.
It is refused when the dispatcher is built, saying what to write, with nothing opened or stored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oncewire import ConfigurationError, Dispatcher, Ledger
from oncewire.aio import AsyncLedger
from oncewire.errors import WrongType


def _tables(store_url: str, backend: str) -> list[str]:
    """oncewire's tables at ``store_url``, read around oncewire (none: the store was never
    created)."""
    if backend == "sqlite":
        import sqlite3

        if not Path(store_url).exists():
            return []
        with sqlite3.connect(store_url) as conn:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        return sorted(name for (name,) in rows)
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
    return sorted(name for (name,) in rows)


@pytest.mark.empty_store
def test_a_path_or_url_instead_of_a_ledger_is_refused_saying_what_to_pass(
    store_url: str, backend: str
) -> None:
    with pytest.raises(TypeError) as caught:
        Dispatcher(store_url, {"send": lambda a: None})  # type: ignore[arg-type]
    assert isinstance(caught.value, WrongType) and isinstance(caught.value, ConfigurationError)
    assert str(caught.value) == (
        f"Dispatcher takes a Ledger, not a str: Dispatcher(oncewire.Ledger({store_url!r}), sinks)"
    )
    assert _tables(store_url, backend) == []  # nothing was opened or created


def test_an_async_ledger_is_refused_pointing_at_its_sync_ledger(store_url: str) -> None:
    async_ledger = AsyncLedger(store_url)
    with pytest.raises(WrongType, match=r"Dispatcher\(async_ledger\.sync, sinks\)"):
        Dispatcher(async_ledger, {"send": lambda a: None})  # type: ignore[arg-type]


@pytest.mark.parametrize("wrong", [None, 42, {"url": "app.db"}], ids=repr)
def test_anything_else_is_refused_naming_its_type(wrong: Any) -> None:
    with pytest.raises(WrongType, match=f"not a {type(wrong).__name__}: Dispatcher"):
        Dispatcher(wrong, {"send": lambda a: None})


def test_a_store_is_refused_and_the_ledger_on_it_is_taken(ledger: Ledger) -> None:
    with pytest.raises(WrongType, match=r"not a \w+Store: "):
        Dispatcher(ledger.store, {"send": lambda a: None})  # type: ignore[arg-type]
    assert Dispatcher(Ledger(ledger.store), {"send": lambda a: None}).ledger.store is ledger.store
