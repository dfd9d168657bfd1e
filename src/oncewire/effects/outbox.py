"""The outbox: accept intents in the caller's transaction; read, cancel and retry them.

:meth:`Effects.accept_in_tx` is the one accept path: a :class:`~oncewire.ledger.LedgerTransaction`
and a run's action ledger both go through it, so an effect is validated (``core.limits``),
bounded (``max_payload_bytes``) and stored the same way whoever accepts it. It is also where an
accept is observed (:mod:`oncewire.core.observe`) and where the accepting span's trace context is
stored with a new effect, so that its attempts continue that trace.
"""

from __future__ import annotations

import builtins
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, digest_json
from oncewire.core.clock import Clock
from oncewire.core.errors import (
    ConfigurationError,
    EffectNotFound,
    KindConflict,
    PayloadConflict,
)
from oncewire.core.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ATTEMPTS_LIMIT,
    MAX_DEADLINE_SECONDS,
    MAX_DELAY_SECONDS,
    MAX_KEY_CHARS,
    MAX_KIND_CHARS,
    check_count,
    check_max_payload_bytes,
    check_name,
    check_seconds,
)
from oncewire.core.observe import ACCEPTED, LISTENERS, current_traceparent, emit
from oncewire.core.states import coerce_states
from oncewire.storage import EffectStore, Transaction
from oncewire.storage.records import AttemptRecord, Effect, EffectState

__all__ = ["ACCEPT_BEFORE_COMMIT", "DEFAULT_MAX_ATTEMPTS", "Effects", "check_accept"]

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
    # an int to Python but never a number of seconds anyone meant; a time past the limits is a
    # date no reader can print. A negative delay is a mistake, not "now".
    delay = check_seconds("delay_seconds", delay_seconds, most=MAX_DELAY_SECONDS)
    if deadline_seconds is not None:
        deadline = check_seconds(
            "deadline_seconds", deadline_seconds, positive=True, most=MAX_DEADLINE_SECONDS
        )
        if delay > deadline:
            raise ConfigurationError(
                f"delay_seconds ({delay_seconds!r}) is past deadline_seconds "
                f"({deadline_seconds!r}): the effect would be due only after its deadline"
            )
    return key, kind


def check_accept(
    key: str,
    kind: str,
    payload: Any,
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    delay_seconds: float = 0.0,
    deadline_seconds: float | None = None,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> None:
    """Refuse what :meth:`Effects.accept_in_tx` would refuse before any SQL, without a store:
    the command line checks its arguments so before it opens (or creates) one."""
    _validate(key, kind, max_attempts, delay_seconds, deadline_seconds)
    canonical_json(payload, max_bytes=max_payload_bytes)


class Effects:
    """Accepting, reading and operating on effects: ``ledger.effects``.

    ``max_payload_bytes`` bounds an accepted payload's canonical JSON (UTF-8 bytes).
    """

    def __init__(
        self,
        store: EffectStore,
        clock: Clock,
        *,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        self._store = store
        self._clock = clock
        # accept_alone's insert, made once: it runs on every Ledger.accept.
        self._insert_alone = functools.partial(
            store.insert_effect_alone, before_commit=ACCEPT_BEFORE_COMMIT.hit
        )
        self.max_payload_bytes = check_max_payload_bytes(max_payload_bytes)

    def accept_in_tx(
        self,
        tx: Transaction,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> tuple[Effect, bool]:
        """Record the intent in ``tx``; returns the effect and whether this call created it.

        The same key with the same canonical payload returns the existing effect; with another
        payload raises :class:`PayloadConflict`, with another kind :class:`KindConflict` (a
        PayloadConflict too). A payload that cannot be stored and read back is
        :class:`InvalidPayload`, a bad key, kind or option :class:`ConfigurationError`, both
        before anything is written. The caller hits :data:`ACCEPT_BEFORE_COMMIT` when it has
        written everything it commits with the effect.
        """
        return self._accept(
            functools.partial(self._store.insert_effect_in_tx, tx),
            key,
            kind,
            payload,
            max_attempts,
            delay_seconds,
            deadline_seconds,
        )

    def accept_alone(
        self,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        delay_seconds: float = 0.0,
        deadline_seconds: float | None = None,
    ) -> tuple[Effect, bool]:
        """:meth:`accept_in_tx` in a transaction of its own, committed when it returns: on
        PostgreSQL one statement and one round trip. A conflict is raised after that commit,
        which wrote nothing (the key's effect was already there, and is left as it was).
        :data:`ACCEPT_BEFORE_COMMIT` is hit where nothing is durable yet."""
        return self._accept(
            self._insert_alone,
            key,
            kind,
            payload,
            max_attempts,
            delay_seconds,
            deadline_seconds,
        )

    def _accept(
        self,
        insert: Callable[..., tuple[Effect, bool]],
        key: str,
        kind: str,
        payload: Any,
        max_attempts: int,
        delay_seconds: float,
        deadline_seconds: float | None,
    ) -> tuple[Effect, bool]:
        key, kind = _validate(key, kind, max_attempts, delay_seconds, deadline_seconds)
        observed = bool(LISTENERS)
        started = time.perf_counter() if observed else 0.0
        # Refuse here, before any SQL, what a reader could not load back (too deep, too large
        # an integer, a lone surrogate) or more than the ledger's max_payload_bytes.
        payload_json = canonical_json(payload, max_bytes=self.max_payload_bytes)
        payload_digest = digest_json(payload_json)
        now = self._clock.now()
        effect, created = insert(
            key=key,
            kind=kind,
            payload_json=payload_json,
            digest=payload_digest,
            max_attempts=max_attempts,
            not_before=now + delay_seconds,
            deadline=None if deadline_seconds is None else now + deadline_seconds,
            now=now,
            traceparent=current_traceparent() if observed else None,
        )
        if not created and effect.kind != kind:
            raise KindConflict(key, effect.kind, kind, effect.digest, payload_digest)
        if not created and effect.digest != payload_digest:
            raise PayloadConflict(key, effect.digest, payload_digest)
        if observed:
            emit(
                ACCEPTED,
                {
                    "key": key,
                    "kind": kind,
                    "created": created,
                    "duration_seconds": time.perf_counter() - started,
                },
            )
        return effect, created

    def get(self, key: str) -> Effect:
        effect = self._store.get_effect(key)
        if effect is None:
            raise EffectNotFound(f"no effect with key {key!r}", key=key)
        return effect

    def find(self, key: str) -> Effect | None:
        return self._store.get_effect(key)

    def list(
        self,
        state: EffectState | str | Sequence[EffectState | str] | None = None,
        *,
        kind: str | None = None,
        limit: int = 100,
        after_id: int = 0,
        newest_first: bool = False,
        before_id: int | None = None,
    ) -> builtins.list[Effect]:
        return self._store.list_effects(
            states=coerce_states(EffectState, state),
            kind=kind,
            limit=limit,
            after_id=after_id,
            newest_first=newest_first,
            before_id=before_id,
        )

    def counts(self, *, kind: str | None = None) -> dict[EffectState, int]:
        return self._store.count_effects(kind=kind)

    def attempts(self, key: str) -> builtins.list[AttemptRecord]:
        """The effect's attempt history, oldest first: each sink call settled, each claim lost
        (owner died, lease expired) or cancelled while in flight."""
        return self._store.list_attempts(self.get(key).id)

    def cancel(self, key: str, reason: str = "cancelled by operator") -> Effect:
        return self._store.cancel_effect(key, now=self._clock.now(), reason=reason)

    def retry(self, key: str) -> Effect:
        return self._store.retry_effect(key, now=self._clock.now())
