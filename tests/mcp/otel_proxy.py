"""``oncewire`` (its arguments the command line) with OpenTelemetry's global tracer provider set
first, as ``opentelemetry-instrument`` sets it from the ``OTEL_*`` variables before a program
runs: the SDK's, exporting each span as it ends, as one JSON line, to ``$SPANS_FILE``."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class FileExporter(SpanExporter):
    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                out.write(span.to_json(indent=None) + "\n")
        return SpanExportResult.SUCCESS


if __name__ == "__main__":
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["SPANS_FILE"])))
    trace.set_tracer_provider(provider)

    from oncewire.cli import main

    sys.exit(main(sys.argv[1:]))
