"""A sink whose receiver lives beside it: every effect through :class:`~oncewire.Receipts`.

``work(tx, attempt)`` performs the effect inside the receipt's transaction, so the work and its
receipt commit together and a redelivery replays the stored result instead of working twice.
The sink also takes a whole claimed batch in one receiver transaction (``call_batch``), each
effect in a savepoint of its own, which is how a co-located receiver keeps up with a batching
dispatcher.

Outcomes: a stored or replayed result is ``Done``; a payload that conflicts with its key is
``Rejected`` (the receiver refused it); ``work`` raising rolls its writes back, so the effect did
not happen: ``NotSent``; the receiver's store failing (a commit whose answer was lost, say) is
``MaybeSent``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from oncewire.core.errors import ConfigurationError, InvalidPayload, PayloadConflict, StorageError
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected
from oncewire.receipts.service import ReceiptResult, Receipts
from oncewire.storage import Transaction

__all__ = ["ReceiptsSink"]

_REFUSED = (PayloadConflict, InvalidPayload, ConfigurationError)


def _outcome(result: ReceiptResult[Any] | Exception) -> EffectOutcome:
    if isinstance(result, ReceiptResult):
        return Done(result.result)
    if isinstance(result, _REFUSED):
        return Rejected(f"{type(result).__name__}: {result}")
    if isinstance(result, StorageError):
        return MaybeSent(f"receiver store failed: {result}")
    return NotSent(f"receiver work failed and was rolled back: {type(result).__name__}: {result}")


class ReceiptsSink:
    """A sink that performs each effect with ``work(tx, attempt)`` inside a receipt's
    transaction (:class:`~oncewire.Receipts`), so a redelivery replays the stored result."""

    def __init__(self, receipts: Receipts, work: Callable[[Transaction, Attempt], Any]) -> None:
        self.receipts = receipts
        self.work = work

    def __call__(self, attempt: Attempt) -> EffectOutcome:
        try:
            result: ReceiptResult[Any] | Exception = self.receipts.run_once(
                attempt.key, attempt.payload, lambda tx: self.work(tx, attempt)
            )
        except Exception as exc:
            result = exc
        return _outcome(result)

    def call_batch(self, attempts: Sequence[Attempt]) -> list[EffectOutcome]:
        by_key = {attempt.key: attempt for attempt in attempts}
        try:
            results = self.receipts.run_many(
                [(attempt.key, attempt.payload) for attempt in attempts],
                lambda tx, key, payload: self.work(tx, by_key[key]),
            )
        except StorageError as exc:  # the whole batch's commit: its fate is unknown
            return [MaybeSent(f"receiver store failed: {exc}")] * len(attempts)
        return [_outcome(result) for result in results]
