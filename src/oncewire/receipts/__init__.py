"""receipts: the receiver side of exactly-once."""

from oncewire.receipts.service import ReceiptResult, Receipts
from oncewire.storage.records import Receipt

__all__ = ["Receipt", "ReceiptResult", "Receipts"]
