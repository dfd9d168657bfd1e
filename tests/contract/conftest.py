"""The store contract: one suite that runs unchanged against every backend.

``store`` is a fresh, empty, migrated store for each test, parametrized over the backends in
``STORE_FACTORIES``. ``raw`` is a second connection to the same database that goes around the
store: contract tests use it to check what a verb really wrote, and that the schema's
constraints hold, by reading and writing the tables directly. Raw SQL in contract tests uses
``?`` placeholders and portable SQL; :mod:`tests.support.tables` translates for a driver that
wants another style.

Adding a backend (the PostgreSQL one, for instance) means one factory in ``STORE_FACTORIES``
that returns a fresh store (a new database or schema per test) and one opener in
``RAW_OPENERS``; no contract test changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from oncewire.storage import Store
from oncewire.storage.records import Claim, Effect, EffectState, Settlement
from oncewire.storage.sqlite import SQLiteStore
from tests.support import tables
from tests.support.claims import settle_and_claim
from tests.support.pg import migrated_schema, server_url

T0 = 1_800_000_000.0  # every contract test's "now": verbs take time as an argument

Row = tuple[Any, ...]


class RawDatabase(tables.Connection):
    """A connection to the store's database that bypasses the store (autocommit)."""

    def effect_row(self, key: str) -> dict[str, Any]:
        names = (
            "id, key, kind, payload, digest, state, attempts, max_attempts, not_before, deadline, "
            "fence, lease_owner, lease_expires_at, maybe_sent, result, last_error, created_at, "
            "updated_at, recoveries, started_fence"
        )
        rows = self.query(f"SELECT {names} FROM oncewire_effects WHERE key = ?", (key,))
        assert len(rows) == 1, f"expected one row for {key!r}, found {len(rows)}"
        return dict(zip(names.split(", "), rows[0], strict=True))

    def count(self, table: str) -> int:
        return int(self.query(f"SELECT COUNT(*) FROM {table}")[0][0])


def _sqlite_store(tmp_path: Path) -> Store:
    return SQLiteStore(str(tmp_path / "contract.db"))


def _sqlite_raw(store: Store) -> RawDatabase:
    assert isinstance(store, SQLiteStore)
    return RawDatabase(store.path)


def _postgres_store(tmp_path: Path) -> Store:
    from oncewire.storage.postgres import PostgresStore

    schema = _PG_SCHEMAS.enter_context(migrated_schema(server_url(), "contract"))
    return PostgresStore(schema)


def _postgres_raw(store: Store) -> RawDatabase:
    return RawDatabase(store.url)


STORE_FACTORIES: dict[str, Callable[[Path], Store]] = {
    "sqlite": _sqlite_store,
    "postgresql": _postgres_store,
}
RAW_OPENERS: dict[str, Callable[[Store], RawDatabase]] = {
    "sqlite": _sqlite_raw,
    "postgresql": _postgres_raw,
}
_PG_SCHEMAS = ExitStack()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run every contract test on every backend the module's verbs exist on.

    A module may set ``BACKENDS`` to the backends its ledger has been ported to; the others are
    not generated (rather than skipped), and the module says why.
    """
    if "store" in metafunc.fixturenames:
        backends = getattr(metafunc.module, "BACKENDS", tuple(STORE_FACTORIES))
        metafunc.parametrize("store", backends, indirect=True)


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened = STORE_FACTORIES[request.param](tmp_path)
    try:
        yield opened
    finally:
        opened.close()
        _PG_SCHEMAS.close()


@pytest.fixture
def raw(store: Store) -> Iterator[RawDatabase]:
    conn = RAW_OPENERS[store.dialect](store)
    try:
        yield conn
    finally:
        conn.close()


class Arrange:
    """Short calls that put a store into the state a test starts from, through its own verbs."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(
        self,
        key: str,
        *,
        kind: str = "send",
        payload_json: str = "{}",
        digest: str = "d" * 64,
        max_attempts: int = 5,
        not_before: float = T0,
        deadline: float | None = None,
        now: float = T0,
    ) -> Effect:
        with self.store.transaction() as tx:
            effect, created = self.store.insert_effect_in_tx(
                tx,
                key=key,
                kind=kind,
                payload_json=payload_json,
                digest=digest,
                max_attempts=max_attempts,
                not_before=not_before,
                deadline=deadline,
                now=now,
            )
        assert created
        return effect

    def claim(
        self,
        *,
        owner: str = "w1",
        now: float = T0,
        lease_seconds: float = 30.0,
        limit: int = 100,
        kinds: Sequence[str] | None = None,
    ) -> list[Claim]:
        _, claims = settle_and_claim(
            self.store,
            [],
            owner=owner,
            now=now,
            lease_seconds=lease_seconds,
            limit=limit,
            kinds=kinds,
        )
        return claims

    def settle(self, *settlements: Settlement, now: float = T0) -> list[bool]:
        applied, claims = settle_and_claim(
            self.store, settlements, owner="nobody", now=now, lease_seconds=30.0, limit=0
        )
        assert claims == []
        return applied

    def get(self, key: str) -> Effect:
        effect = self.store.get_effect(key)
        assert effect is not None, key
        return effect

    def into(self, key: str, state: EffectState, *, now: float = T0, **kw: Any) -> Effect:
        """Add ``key`` and drive it through the store's verbs into ``state``.

        Its kind is ``arranged.KEY`` unless given, so that arranging it claims nothing else.
        """
        kind = kw.pop("kind", f"arranged.{key}")
        self.add(key, kind=kind, now=now, not_before=now, **kw)
        if state is EffectState.PENDING:
            return self.get(key)
        (claim,) = self.claim(now=now, kinds=[kind], limit=1)
        assert claim.key == key
        if state is EffectState.CLAIMED:
            return self.get(key)
        if state is EffectState.CANCELLED:
            return self.store.cancel_effect(key, now=now, reason="arranged")
        settlement = Settlement(
            claim.id,
            claim.fence,
            state,
            result_json='{"ok":true}' if state is EffectState.DONE else None,
            last_error=None if state is EffectState.DONE else f"arranged {state}",
            not_before=now + 60.0 if state is EffectState.UNCERTAIN else None,
            maybe_sent=state is EffectState.UNCERTAIN,
        )
        assert self.settle(settlement, now=now) == [True]
        return self.get(key)


@pytest.fixture
def arrange(store: Store) -> Arrange:
    return Arrange(store)
