"""The outbox: accept intents in the caller's transaction; read, cancel and retry them."""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from functools import cached_property
from typing import TYPE_CHECKING, Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, digest_json
from oncewire.core.clock import Clock, SystemClock
from oncewire.core.errors import (
    ConfigurationError,
    EffectNotFound,
    InvalidState,
    KindConflict,
    PayloadConflict,
)
from oncewire.core.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ATTEMPTS_LIMIT,
    MAX_KEY_CHARS,
    MAX_KIND_CHARS,
    check_count,
    check_max_payload_bytes,
    check_name,
    check_seconds,
)
from oncewire.storage import DEFAULT_OPEN_TIMEOUT_SECONDS, Store, open_store
from oncewire.storage.base import Transaction
from oncewire.storage.records import AttemptRecord, Effect, EffectState

if TYPE_CHECKING:
    from oncewire.inbound.service import InboundView
    from oncewire.replies.service import RepliesView
    from oncewire.runs.service import RunsView

__all__ = ["DEFAULT_MAX_ATTEMPTS", "EffectsView", "Ledger", "LedgerTransaction"]

DEFAULT_MAX_ATTEMPTS = 10

ACCEPT_BEFORE_COMMIT = crash.register(
    "effects.accept_before_commit",
    "the caller's rows and the accepted effect are written but not committed",
)


def _validate(
    key: str, kind: str, max_attempts: int, delay_seconds: float, deadline_seconds: float | None
) -> tuple[str, str]:
    """(key, kind) as plain strings, or ConfigurationError before any SQL (the same refusal
    on every backend)."""
    key = check_name("an effect key", key, MAX_KEY_CHARS)
    kind = check_name("an effect kind", kind, MAX_KIND_CHARS)
    check_count("max_attempts", max_attempts, 1, MAX_ATTEMPTS_LIMIT)
    # NaN would be stored as NULL (no deadline) and Infinity as an effect never due; a bool is
    # an int to Python but never a number of seconds anyone meant. A negative delay is "now".
    if (
        type(delay_seconds) is bool
        or not isinstance(delay_seconds, int | float)
        or not math.isfinite(delay_seconds)
    ):
        raise ConfigurationError(f"delay_seconds must be a finite number, not {delay_seconds!r}")
    if deadline_seconds is not None:
        check_seconds("deadline_seconds", deadline_seconds, positive=True)
    return key, kind


class _NotOpen:
    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        raise InvalidState("use the transaction inside its with block")


_NOT_OPEN = _NotOpen()


class LedgerTransaction:
    """A transaction shared by the caller's own tables and the outbox.

    ``with ledger.transaction() as tx`` commits on normal exit and rolls back on an exception.
    """

    def __init__(self, ledger: Ledger, scope: AbstractContextManager[Transaction]) -> None:
        self._ledger = ledger
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

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run the caller's own SQL in this transaction."""
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
        key, kind = _validate(key, kind, max_attempts, delay_seconds, deadline_seconds)
        # Refused here, before any SQL: what a reader could not load back (too deep, too large
        # an integer, a lone surrogate) or more than the ledger's max_payload_bytes.
        payload_json = canonical_json(payload, max_bytes=self._ledger.max_payload_bytes)
        payload_digest = digest_json(payload_json)
        now = self._ledger.clock.now()
        effect, created = self._ledger.store.insert_effect_in_tx(
            self._raw,
            key=key,
            kind=kind,
            payload_json=payload_json,
            digest=payload_digest,
            max_attempts=max_attempts,
            not_before=now + max(0.0, delay_seconds),
            deadline=None if deadline_seconds is None else now + deadline_seconds,
            now=now,
        )
        if not created and effect.kind != kind:
            raise KindConflict(key, effect.kind, kind, effect.digest, payload_digest)
        if not created and effect.digest != payload_digest:
            raise PayloadConflict(key, effect.digest, payload_digest)
        if created:
            self.accepted.append(effect)
        return effect


class EffectsView:
    """Reading and operating on effects: ``ledger.effects``."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def get(self, key: str) -> Effect:
        effect = self._ledger.store.get_effect(key)
        if effect is None:
            raise EffectNotFound(f"no effect with key {key!r}", key=key)
        return effect

    def find(self, key: str) -> Effect | None:
        return self._ledger.store.get_effect(key)

    def list(
        self,
        state: EffectState | str | Sequence[EffectState | str] | None = None,
        *,
        kind: str | None = None,
        limit: int = 100,
        after_id: int = 0,
        newest_first: bool = False,
        before_id: int | None = None,
    ) -> list[Effect]:
        if state is None:
            states: list[EffectState] = []
        elif isinstance(state, str):
            states = [_state(state)]
        else:
            states = [_state(s) for s in state]
        return self._ledger.store.list_effects(
            states=states,
            kind=kind,
            limit=limit,
            after_id=after_id,
            newest_first=newest_first,
            before_id=before_id,
        )

    def counts(self, *, kind: str | None = None) -> dict[EffectState, int]:
        return self._ledger.store.count_effects(kind=kind)

    def attempts(self, key: str) -> builtins.list[AttemptRecord]:
        """The effect's attempt history, oldest first: each sink call settled, each claim lost
        (owner died, lease expired) or cancelled while in flight."""
        return self._ledger.store.list_attempts(self.get(key).id)

    def cancel(self, key: str, reason: str = "cancelled by operator") -> Effect:
        return self._ledger.store.cancel_effect(key, now=self._ledger.clock.now(), reason=reason)

    def retry(self, key: str) -> Effect:
        return self._ledger.store.retry_effect(key, now=self._ledger.clock.now())


def _state(value: EffectState | str) -> EffectState:
    try:
        return EffectState(value)
    except ValueError:
        names = ", ".join(s.value for s in EffectState)
        raise ConfigurationError(f"unknown effect state {value!r} (one of: {names})") from None


class Ledger:
    """The caller's side: ``Ledger("app.db")`` or ``Ledger("postgresql://...")``.

    ``max_payload_bytes`` bounds an accepted payload's canonical JSON (UTF-8 bytes).
    ``open_timeout_seconds`` bounds how long opening rides out a busy file or a database that
    is restarting; a permanent failure (not a database, read-only, corrupt) is raised at once.
    """

    def __init__(
        self,
        url_or_path: str | Store,
        *,
        clock: Clock | None = None,
        create: bool = True,
        runs_key: bytes | None = None,
        reconcile_runs_as: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    ) -> None:
        self.max_payload_bytes = check_max_payload_bytes(max_payload_bytes)
        self.store = (
            url_or_path
            if isinstance(url_or_path, Store)
            else open_store(url_or_path, create=create, open_timeout_seconds=open_timeout_seconds)
        )
        self.clock: Clock = clock or SystemClock()
        self.effects = EffectsView(self)
        self._runs_key = runs_key
        self._runs: RunsView | None = None
        if reconcile_runs_as is not None:  # boot: close what dead owners left (reports kept)
            try:
                self.runs.reconcile(owner=reconcile_runs_as)
            except BaseException:
                self.store.close()  # a ledger that failed to open must not leak its store
                raise

    @property
    def runs(self) -> RunsView:
        """The run ledger (``runs_key``, held outside the database, makes its chain HMAC)."""
        if self._runs is None:
            from oncewire.runs.service import RunsView

            self._runs = RunsView(self, key=self._runs_key)
        return self._runs

    def transaction(self) -> LedgerTransaction:
        """One transaction for the caller's rows and the intents they accept."""
        return LedgerTransaction(self, self.store.transaction())

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
        """Accept one effect in a transaction of its own."""
        with self.transaction() as tx:
            return tx.accept(
                key,
                kind,
                payload,
                max_attempts=max_attempts,
                delay_seconds=delay_seconds,
                deadline_seconds=deadline_seconds,
            )

    @cached_property
    def inbound(self) -> InboundView:
        """Inbound chat messages, admitted once."""
        from oncewire.inbound.service import InboundView

        return InboundView(self)

    @cached_property
    def replies(self) -> RepliesView:
        """Reply records and their wire operations."""
        from oncewire.replies.service import RepliesView

        return RepliesView(self)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
