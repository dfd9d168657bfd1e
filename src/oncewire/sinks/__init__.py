"""sinks: adapters that perform effects.

Each sink loads on first use (PEP 562): the HTTP and NATS sinks bring asyncio and email with
them, and a process that runs only a subprocess sink (the lab starts hundreds) should not pay
for those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oncewire.core import lazy as _lazy

if TYPE_CHECKING:
    from oncewire.sinks.http import HttpSink
    from oncewire.sinks.nats import NatsJetStreamSink
    from oncewire.sinks.receipts import ReceiptsSink
    from oncewire.sinks.subprocess import SubprocessSink

__all__ = ["HttpSink", "NatsJetStreamSink", "ReceiptsSink", "SubprocessSink"]

_HOME = {
    "HttpSink": "oncewire.sinks.http",
    "NatsJetStreamSink": "oncewire.sinks.nats",
    "ReceiptsSink": "oncewire.sinks.receipts",
    "SubprocessSink": "oncewire.sinks.subprocess",
}

if not TYPE_CHECKING:  # a type checker keeps reporting unknown names as errors
    __getattr__, __dir__ = _lazy.names(globals(), _HOME)
