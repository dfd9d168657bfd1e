"""The receipts verbs, written once (statements in ``storage/sql/receipts.sql``)."""

from __future__ import annotations

from oncewire.storage.driver import Driver, Transaction
from oncewire.storage.records import Receipt

__all__ = ["ReceiptVerbs"]


class ReceiptVerbs:
    """The receiver's seam: reserve, complete, read and purge idempotency receipts."""

    db: Driver

    def reserve_receipt_in_tx(
        self,
        tx: Transaction,
        *,
        key: str,
        digest: str,
        payload_json: str,
        now: float,
        expires_at: float | None,
    ) -> Receipt | None:
        """Reserve ``key`` (None) or return the receipt already stored under it."""
        db, q = self.db, self.db.queries
        with db.in_tx(tx, "reserving a receipt") as conn:
            inserted = db.run(
                conn,
                q.reserve_receipt,
                key=key,
                digest=digest,
                payload=payload_json,
                now=now,
                expires_at=expires_at,
            )
            if inserted:
                return None
            row = db.one(conn, q.get_receipt, key=key)
        assert row is not None  # the insert conflicted with it, in this transaction
        return Receipt.from_row(row)

    def complete_receipt_in_tx(self, tx: Transaction, *, key: str, result_json: str) -> None:
        db = self.db
        with db.in_tx(tx, "completing a receipt") as conn:
            db.run(conn, db.queries.complete_receipt, result=result_json, key=key)

    def get_receipt(self, key: str) -> Receipt | None:
        rows = self.db.read(self.db.queries.get_receipt, key=key)
        return Receipt.from_row(rows[0]) if rows else None

    def list_receipts(self, *, limit: int = 100, after_key: str = "") -> list[Receipt]:
        rows = self.db.read(self.db.queries.list_receipts, after_key=after_key, limit=limit)
        return [Receipt.from_row(row) for row in rows]

    def purge_receipts(self, *, expired_before: float) -> int:
        """Delete receipts whose retention ended before ``expired_before``. Operator-only."""
        db = self.db
        with db.write("purging receipts") as conn:
            return db.run(conn, db.queries.purge_receipts, expired_before=expired_before)
