"""sinks: adapters that perform effects."""

from oncewire.sinks.receipts import ReceiptsSink
from oncewire.sinks.subprocess import SubprocessSink

__all__ = ["ReceiptsSink", "SubprocessSink"]
