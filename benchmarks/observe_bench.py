"""What observation costs: accept and end to end with nobody listening, a listener that does
nothing, and oncewire.otel into the SDK's in-memory exporter, in the same run.

    .venv/bin/python benchmarks/observe_bench.py [--quick] [--count N] [--rounds R] [--json FILE]
    .venv/bin/python benchmarks/observe_bench.py --db postgresql://127.0.0.1:5432/test

Rows: ``accept`` (one effect per transaction, one after the other) and ``end to end`` (accept,
then a dispatcher drains the outbox to a sink that counts). Columns: effects per second with
nobody listening (``off``), with a listener that drops every observation (``listener``: the cost
of building and handing over the attributes) and with ``oncewire.otel.instrument`` into
in-memory SDK providers (``otel``: spans, metrics and a stored traceparent per effect; only when
the otel extra is installed), and each one's ratio to ``off``. The modes run on fresh stores,
interleaved round by round, and the median of the rounds is shown. Every run checks that each
effect was delivered once; the figures are timings on a shared machine: compare the columns of
one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aio_bench import fresh_store
from oncewire import Dispatcher, Ledger, __version__
from oncewire.core import observe


def accept(url: str, count: int) -> float:
    with Ledger(url) as ledger:
        started = time.perf_counter()
        for n in range(count):
            ledger.accept(f"k{n}", "ship", {"n": n})
        return time.perf_counter() - started


def end_to_end(url: str, count: int) -> float:
    delivered: list[str] = []
    with Ledger(url) as ledger:
        started = time.perf_counter()
        for n in range(count):
            ledger.accept(f"k{n}", "ship", {"n": n})
        Dispatcher(ledger, sinks={"ship": lambda a: delivered.append(a.key)}).run(
            until_idle=True, handle_signals=False
        )
        seconds = time.perf_counter() - started
    if sorted(delivered) != sorted(f"k{n}" for n in range(count)):
        raise SystemExit(f"end to end delivered {len(delivered)} of {count}, or some twice")
    return seconds


@contextmanager
def mode(name: str) -> Iterator[Callable[[], int]]:
    """Listen as ``name`` says; yields how many observations (or spans) were taken."""
    if name == "off":
        yield lambda: 0
        return
    if name == "listener":
        heard = [0]

        def drop(event: str, attributes: Any) -> None:
            heard[0] += 1

        stop = observe.listen(drop)
        try:
            yield lambda: heard[0]
        finally:
            stop()
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from oncewire.otel import instrument

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instrumentation = instrument(tracer_provider, meter_provider)
    try:
        with tracer_provider.get_tracer("bench").start_as_current_span("bench"):
            yield lambda: len(exporter.get_finished_spans())
    finally:
        instrumentation.uninstrument()
        tracer_provider.shutdown()
        meter_provider.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="a PostgreSQL URL (default: SQLite files)")
    parser.add_argument("--count", type=int, default=2000, help="effects per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--json", type=Path, help="write every figure to this file")
    args = parser.parse_args(argv)
    count, rounds = (50, 1) if args.quick else (args.count, args.rounds)
    try:
        import opentelemetry.sdk  # noqa: F401

        modes = ["off", "listener", "otel"]
    except ImportError:
        modes = ["off", "listener"]
    rows: dict[str, Callable[[str, int], float]] = {"accept": accept, "end to end": end_to_end}
    seconds: dict[str, dict[str, list[float]]] = {r: {m: [] for m in modes} for r in rows}
    observed: dict[str, dict[str, int]] = {r: {} for r in rows}
    with tempfile.TemporaryDirectory(prefix="oncewire-observe-bench-") as folder:
        for _ in range(rounds):
            for row, run in rows.items():
                for name in modes:
                    with fresh_store(args.db, Path(folder), name) as url, mode(name) as taken:
                        seconds[row][name].append(run(url, count))
                        observed[row][name] = taken()
    figures: dict[str, Any] = {
        "version": __version__,
        "backend": "postgresql" if args.db else "sqlite",
        "count": count,
        "rounds": rounds,
        "rows": {},
    }
    print(f"oncewire {__version__}, {figures['backend']}, {count} effects, {rounds} round(s)")
    print(f"{'':12}" + "".join(f"{m + ' /s':>14}{'ratio':>8}" for m in modes))
    for row in rows:
        rates = {m: count / statistics.median(seconds[row][m]) for m in modes}
        ratios = {m: rates[m] / rates["off"] for m in modes}
        figures["rows"][row] = {
            "per_second": rates,
            "ratio_to_off": ratios,
            "seconds": seconds[row],
            "observed": observed[row],
        }
        print(f"{row:12}" + "".join(f"{rates[m]:>14.0f}{ratios[m]:>8.2f}" for m in modes))
    for row in rows:  # a mode that saw nothing measured nothing
        for name in modes[1:]:
            if observed[row][name] == 0:
                raise SystemExit(f"{row}: the {name} mode observed nothing")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
