"""Receipts: run a receiver's work once per key, bound to its payload.

``run_once(key, payload, fn)`` opens one transaction, reserves the key, runs ``fn(tx)`` inside
the same transaction and stores its result with the receipt. The work and its receipt commit
together or not at all, so a redelivery finds either nothing (and does the work) or the receipt
(and replays its result). A different payload under a used key is a :class:`PayloadConflict`
and writes nothing.

Receipts are kept for an explicit retention window. Nothing expires on its own: dropping old
receipts is an operator's decision (:meth:`Receipts.purge`), because a purged key accepts its
payload again as new work.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, digest_json, loads
from oncewire.core.clock import Clock, SystemClock
from oncewire.core.errors import ConfigurationError, PayloadConflict, ReceiptNotFound
from oncewire.core.limits import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_KEY_CHARS,
    check_max_payload_bytes,
    check_name,
    check_seconds,
)
from oncewire.storage import (
    DEFAULT_OPEN_TIMEOUT_SECONDS,
    ReceiptStore,
    Store,
    Transaction,
    open_store,
)
from oncewire.storage.records import Receipt

__all__ = ["DEFAULT_RETENTION_SECONDS", "ReceiptResult", "Receipts"]

DEFAULT_RETENTION_SECONDS = 30 * 24 * 3600.0

T = TypeVar("T")

AFTER_WORK_BEFORE_COMMIT = crash.register(
    "receipts.after_work_before_commit",
    "the receiver did its work and wrote the receipt; neither is committed",
)
AFTER_COMMIT_BEFORE_REPLY = crash.register(
    "receipts.after_commit_before_reply",
    "the work and its receipt are committed; the caller has not been answered",
)


@dataclass(frozen=True, slots=True)
class ReceiptResult(Generic[T]):
    """What :meth:`Receipts.run_once` returns."""

    key: str
    result: T
    replayed: bool  # True when the result came from an earlier run


def _check_key(key: str) -> str:
    # The same rules as an effect key (receipts are usually keyed by one), before any SQL.
    return check_name("a receipt key", key, MAX_KEY_CHARS)


class Receipts:
    """The receiver's store of receipts: ``Receipts("downstream.db")``.

    ``max_payload_bytes`` bounds a payload's canonical JSON (UTF-8 bytes), as for effects.
    ``create``, ``adopt`` and ``read_only`` open the store as :class:`~oncewire.Ledger` does.
    """

    def __init__(
        self,
        url_or_path: str | Store,
        *,
        retention_seconds: float | None = DEFAULT_RETENTION_SECONDS,
        clock: Clock | None = None,
        create: bool = True,
        adopt: bool = True,
        read_only: bool = False,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        open_timeout_seconds: float = DEFAULT_OPEN_TIMEOUT_SECONDS,
    ) -> None:
        if retention_seconds is not None:
            try:
                check_seconds("retention_seconds", retention_seconds, positive=True)
            except ConfigurationError:
                raise ConfigurationError(
                    "retention_seconds must be a positive, finite number of seconds (or None to "
                    f"keep all), not {retention_seconds!r}"
                ) from None
        self.max_payload_bytes = check_max_payload_bytes(max_payload_bytes)
        self.store: ReceiptStore = (
            url_or_path
            if isinstance(url_or_path, Store)
            else open_store(
                url_or_path,
                create=create,
                adopt=adopt,
                read_only=read_only,
                open_timeout_seconds=open_timeout_seconds,
            )
        )
        self.retention_seconds = retention_seconds
        self.clock: Clock = clock or SystemClock()

    def run_once(self, key: str, payload: Any, fn: Callable[[Transaction], T]) -> ReceiptResult[T]:
        """Run ``fn(tx)`` once for ``key`` and ``payload``; replay its result afterwards.

        ``fn``'s result must be JSON-serialisable (it is what a replay returns).
        """
        key = _check_key(key)
        payload_json = canonical_json(payload, max_bytes=self.max_payload_bytes)
        now = self.clock.now()
        with self.store.transaction() as tx:
            outcome = self._run_in_tx(tx, key, payload_json, now, lambda: fn(tx))
            AFTER_WORK_BEFORE_COMMIT.hit()
        AFTER_COMMIT_BEFORE_REPLY.hit()
        return outcome

    def run_many(
        self,
        items: Sequence[tuple[str, Any]],
        fn: Callable[[Transaction, str, Any], T],
    ) -> list[ReceiptResult[T] | Exception]:
        """``run_once`` for many ``(key, payload)`` items in one transaction (one commit).

        Each item runs in a savepoint of its own: an item whose ``fn`` raises, or whose payload
        conflicts with its key, has its writes rolled back and its exception returned in its
        place, while the others commit. Results come back in the order of ``items``.
        """
        now = self.clock.now()
        max_bytes = self.max_payload_bytes
        savepoint = self.store.savepoint_in_tx
        results: list[ReceiptResult[T] | Exception] = []
        with self.store.transaction() as tx:
            for key, payload in items:
                try:
                    key = _check_key(key)
                    payload_json = canonical_json(payload, max_bytes=max_bytes)
                    # One name for every item (each is released before the next opens): the
                    # same SQL text each time, so the connection's statement cache keeps it and
                    # the work's own statements, instead of being flooded by one per item.
                    with savepoint(tx, "oncewire_item"):
                        work = functools.partial(fn, tx, key, payload)
                        results.append(self._run_in_tx(tx, key, payload_json, now, work))
                except Exception as exc:
                    results.append(exc)
            AFTER_WORK_BEFORE_COMMIT.hit()
        AFTER_COMMIT_BEFORE_REPLY.hit()
        return results

    def _run_in_tx(
        self, tx: Transaction, key: str, payload_json: str, now: float, work: Callable[[], T]
    ) -> ReceiptResult[T]:
        payload_digest = digest_json(payload_json)
        expires = None if self.retention_seconds is None else now + self.retention_seconds
        existing = self.store.reserve_receipt_in_tx(
            tx,
            key=key,
            digest=payload_digest,
            payload_json=payload_json,
            now=now,
            expires_at=expires,
        )
        if existing is not None:
            if existing.digest != payload_digest:
                raise PayloadConflict(key, existing.digest, payload_digest)
            replay: Any = loads(existing.result_json or "null")
            return ReceiptResult(key, replay, True)
        result = work()
        self.store.complete_receipt_in_tx(tx, key=key, result_json=canonical_json(result))
        return ReceiptResult(key, result, False)

    def get(self, key: str) -> Receipt:
        receipt = self.store.get_receipt(key)
        if receipt is None:
            raise ReceiptNotFound(f"no receipt with key {key!r}", key=key)
        return receipt

    def list(self, *, limit: int = 100, after_key: str = "") -> list[Receipt]:
        return self.store.list_receipts(limit=limit, after_key=after_key)

    def purge(self, *, now: float | None = None) -> int:
        """Delete receipts whose retention window has ended. Returns how many."""
        return self.store.purge_receipts(expired_before=self.clock.now() if now is None else now)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Receipts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
