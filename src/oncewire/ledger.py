"""The composition root: :class:`Ledger` opens a store and builds every ledger over it.

``Ledger("app.db")`` or ``Ledger("postgresql://...")`` constructs, eagerly and with explicit
dependencies, the outbox (``ledger.effects``), the inbox (``ledger.inbound``), the reply
ledger (``ledger.replies``, which reads the inbox) and the run ledger (``ledger.runs``, whose
action ledger accepts through the outbox). Nothing below this module imports it: the ledgers
know only the store, the clock and the siblings they are given; the engines above
(``Dispatcher``, ``ReplyEngine``) take a ``Ledger``.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from oncewire.core.clock import Clock, SystemClock
from oncewire.core.errors import ConfigurationError, InvalidState
from oncewire.core.limits import DEFAULT_MAX_PAYLOAD_BYTES, check_max_payload_bytes
from oncewire.effects.outbox import ACCEPT_BEFORE_COMMIT, DEFAULT_MAX_ATTEMPTS, Effects
from oncewire.inbound.service import Inbox
from oncewire.replies.service import Replies
from oncewire.runs.service import Runs
from oncewire.storage import DEFAULT_OPEN_TIMEOUT_SECONDS, Store, Transaction, open_store
from oncewire.storage.records import Effect

__all__ = ["DEFAULT_MAX_ATTEMPTS", "Ledger", "LedgerTransaction"]


class _NotOpen:
    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        raise InvalidState("use the transaction inside its with block")


_NOT_OPEN = _NotOpen()


class LedgerTransaction:
    """A transaction shared by the caller's own tables and the outbox.

    ``with ledger.transaction() as tx`` commits on normal exit and rolls back on an exception.
    """

    def __init__(self, effects: Effects, scope: AbstractContextManager[Transaction]) -> None:
        self._effects = effects
        self._scope = scope
        self._raw: Transaction = _NOT_OPEN
        self.accepted: list[Effect] = []

    def __enter__(self) -> LedgerTransaction:
        self._raw = self._scope.__enter__()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None and self.accepted:
            ACCEPT_BEFORE_COMMIT.hit()
        self._scope.__exit__(exc_type, exc, tb)

    @property
    def store_transaction(self) -> Transaction:
        """The store's transaction this one wraps, for the ledgers' ``_in_tx`` verbs: pass
        ``tx`` itself to ``ledger.inbound.start_in_tx(tx, ...)``, ``ledger.replies.open_in_tx``,
        ``ledger.runs.turn.start_in_tx`` and the like, and they write in this transaction."""
        return self._raw

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run the caller's own SQL in this transaction; returns the driver's cursor.

        The portable form, which runs unchanged on SQLite and PostgreSQL, is ``:name``
        placeholders with a dict::

            tx.execute("INSERT INTO orders (id, total) VALUES (:id, :total)",
                       {"id": 42, "total": 1999})

        On PostgreSQL the text is translated (once per distinct text) to psycopg's
        ``%(name)s``: a ``:name`` inside a string literal, a quoted identifier, a dollar quote
        or a comment is left alone, ``x::int`` stays a cast, and a literal ``%`` needs no
        escaping. A ``:`` directly followed by a name is always a placeholder: write an array
        slice as ``a[1 : n]``. It is the only style: positional values (``?`` on SQLite, ``%s``
        on PostgreSQL) and a driver's own placeholders (``%s``, ``%(name)s``; ``?``, ``$name``,
        ``@name`` on SQLite; ``$1`` on PostgreSQL) are :class:`StatementError` before they run,
        since they would run on one backend only.

        Statements that would end the shared transaction or change the connection are refused
        (:class:`InvalidState`) before they run; see :mod:`oncewire.storage.sqlguard`.
        """
        return self._raw.execute(sql, params)

    def accept(
        self,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> Effect:
        """Record the intent. Durable when this transaction commits, together with the rest.

        The same key with the same canonical payload returns the existing effect; with another
        payload raises :class:`PayloadConflict`, with another kind :class:`KindConflict` (a
        PayloadConflict too), and the whole transaction rolls back when the exception leaves
        the ``with`` block. A payload that cannot be stored and read back is
        :class:`InvalidPayload`, a bad key, kind or option :class:`ConfigurationError`, both
        before anything is written.
        """
        effect, created = self._effects.accept_in_tx(
            self._raw,
            key,
            kind,
            payload,
            max_attempts=max_attempts,
            delay_seconds=delay_seconds,
            deadline_seconds=deadline_seconds,
        )
        if created:
            self.accepted.append(effect)
        return effect


class Ledger:
    """The caller's side: ``Ledger("app.db")`` or ``Ledger("postgresql://...")``.

    ``max_payload_bytes`` bounds an accepted payload's canonical JSON (UTF-8 bytes), whether
    the caller or a run's action accepts it. ``runs_key`` (held outside the database) makes
    the run ledger's chain an HMAC. ``reconcile_runs_as`` closes, at boot, what dead owners
    left (see :meth:`Runs.reconcile`). ``open_timeout_seconds`` bounds how long opening rides
    out a busy file or a database that is restarting; a permanent failure (not a database,
    read-only, corrupt) is raised at once. A database that already holds the application's
    tables gains oncewire's beside them unless ``adopt=False``; ``read_only=True`` opens an
    existing store without writing to it (see :func:`oncewire.storage.open_store`).

    ``group_commit=True`` lets the transactions that many threads of this process open
    (``ledger.transaction()``, :meth:`accept`) share commits, so that concurrent callers are not
    held to one flush of the disk each; every caller still returns only once its own
    transaction is durable, and a caller that fails is rolled back alone
    (:mod:`oncewire.storage.grouping`). It applies to the store this ledger opens; a
    :class:`Store` passed in is used as it was opened.
    """

    def __init__(
        self,
        url_or_path: str | Store,
        *,
        clock: Clock | None = None,
        create: bool = True,
        adopt: bool = True,
        read_only: bool = False,
        runs_key: bytes | None = None,
        reconcile_runs_as: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
        group_commit: bool = False,
    ) -> None:
        check_max_payload_bytes(max_payload_bytes)  # refused before a store is opened
        if isinstance(url_or_path, Store) and group_commit and not url_or_path.commits_grouped:
            raise ConfigurationError(
                "group_commit=True applies to a store the ledger opens: open the store with "
                "group_commit=True instead"
            )
        self.store = (
            url_or_path
            if isinstance(url_or_path, Store)
            else open_store(
                url_or_path,
                create=create,
                adopt=adopt,
                read_only=read_only,
                open_timeout_seconds=open_timeout_seconds,
                group_commit=group_commit,
            )
        )
        self.clock: Clock = clock or SystemClock()
        self.effects = Effects(self.store, self.clock, max_payload_bytes=max_payload_bytes)
        self.inbound = Inbox(self.store, self.clock)
        self.replies = Replies(self.store, self.clock, inbox=self.inbound)
        self.runs = Runs(self.store, self.clock, key=runs_key, effects=self.effects)
        if reconcile_runs_as is not None:  # boot: close what dead owners left (reports kept)
            try:
                self.runs.reconcile(owner=reconcile_runs_as)
            except BaseException:
                self.store.close()  # a ledger that failed to open must not leak its store
                raise

    @property
    def max_payload_bytes(self) -> int:
        return self.effects.max_payload_bytes

    def transaction(self) -> LedgerTransaction:
        """One transaction for the caller's rows and the intents they accept."""
        return LedgerTransaction(self.effects, self.store.transaction())

    def accept(
        self,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> Effect:
        """Accept one effect in a transaction of its own (on PostgreSQL one statement, one
        round trip). Inside this thread's open :meth:`transaction` it is
        :class:`InvalidState`: accept there with ``tx.accept``."""
        effect, _ = self.effects.accept_alone(
            key,
            kind,
            payload,
            max_attempts=max_attempts,
            delay_seconds=delay_seconds,
            deadline_seconds=deadline_seconds,
        )
        return effect

    def accept_in(
        self,
        connection: Any,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> Effect:
        """Record the intent through the caller's own connection, in the caller's transaction.

        For an application that owns its connection and transaction (a web framework's
        request, an ORM session): ``connection`` is a psycopg 3 connection to this ledger's
        PostgreSQL database (or a ``sqlite3.Connection`` to its SQLite file), inside an open
        transaction. The effect is written through it with the same validation, limits and
        conflicts as :meth:`LedgerTransaction.accept`; it becomes durable, and visible to the
        dispatcher, when the caller commits, and disappears if the caller rolls back.
        Committing is the caller's: oncewire never commits or rolls back this connection.

        A connection that is not inside an open transaction (idle, autocommit between
        statements, closed, or in a failed transaction) is :class:`InvalidState`, and so is
        one of the other backend's driver, before anything is written. The connection must
        see oncewire's tables (same database; on PostgreSQL the same ``search_path`` when the
        ledger uses a schema of its own). With SQLAlchemy, pass the DBAPI connection
        (``session.connection().connection.driver_connection``).
        """
        tx = self.store.caller_transaction(connection)
        effect, _ = self.effects.accept_in_tx(
            tx,
            key,
            kind,
            payload,
            max_attempts=max_attempts,
            delay_seconds=delay_seconds,
            deadline_seconds=deadline_seconds,
        )
        return effect

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
