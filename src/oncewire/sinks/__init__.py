"""sinks: adapters that perform effects."""

from oncewire.sinks.http import HttpSink
from oncewire.sinks.nats import NatsJetStreamSink
from oncewire.sinks.receipts import ReceiptsSink
from oncewire.sinks.subprocess import SubprocessSink

__all__ = ["HttpSink", "NatsJetStreamSink", "ReceiptsSink", "SubprocessSink"]
