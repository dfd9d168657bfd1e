"""oncewire.otel against the OpenTelemetry SDK's in-memory exporter and reader, on a real SQLite
file and a real PostgreSQL server.

What the spans and metrics say is checked against what the store holds (read around oncewire)
and what the fake platform journaled, never against what oncewire reports about itself.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from oncewire import Dispatcher, Ledger, Rejected
from oncewire.core import observe
from oncewire.core.clock import ManualClock
from oncewire.core.errors import TransitionRefused
from oncewire.dispatch.retry import RetryPolicy
from oncewire.effects.attempt import Attempt
from oncewire.otel import Instrumentation, instrument
from tests.conftest import wait_for
from tests.support import tables


class Telemetry:
    """An instrumentation wired to in-memory SDK providers, and readers of what they hold."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.instrumentation: Instrumentation = instrument(
            self.tracer_provider, self.meter_provider
        )
        self.tracer = self.tracer_provider.get_tracer("app")

    def close(self) -> None:
        self.instrumentation.uninstrument()
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]

    def points(self, metric: str) -> list[tuple[dict[str, Any], Any]]:
        """(attributes, value) of each data point of ``metric`` collected now."""
        data = self.reader.get_metrics_data()
        found: list[tuple[dict[str, Any], Any]] = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for item in scope.metrics:
                    if item.name == metric:
                        for point in item.data.data_points:
                            value = getattr(point, "value", None)
                            if value is None:
                                value = point.count  # a histogram: how many were recorded
                            found.append((dict(point.attributes or {}), value))
        return found


@pytest.fixture
def telemetry() -> Iterator[Telemetry]:
    opened = Telemetry()
    try:
        yield opened
    finally:
        opened.close()
    assert observe.LISTENERS == []


def traceparent_of(span: Any) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def test_an_attempt_continues_the_trace_its_effect_was_accepted_under(
    store_url: str, telemetry: Telemetry
) -> None:
    with Ledger(store_url) as ledger:
        with ledger.transaction() as tx:
            tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
        with (
            telemetry.tracer.start_as_current_span("checkout") as checkout,
            ledger.transaction() as tx,
        ):
            tx.execute("INSERT INTO orders (id) VALUES (1)")
            tx.accept("charge-1", "charge", {"order": 1})
        ledger.accept("untraced", "charge", {"order": 2})  # no span current

        stored = dict(tables.rows(store_url, "SELECT key, traceparent FROM oncewire_effects"))
        assert stored == {"charge-1": traceparent_of(checkout), "untraced": None}

        calls: list[str] = []

        def charge(attempt: Attempt) -> dict[str, str]:
            calls.append(attempt.key)
            return {"charged": attempt.key}

        Dispatcher(ledger, {"charge": charge}).run(until_idle=True, handle_signals=False)

    assert sorted(calls) == ["charge-1", "untraced"]
    assert tables.rows(store_url, "SELECT key, state FROM oncewire_effects ORDER BY key") == [
        ("charge-1", "done"),
        ("untraced", "done"),
    ]
    trace_id = checkout.get_span_context().trace_id
    (accept,) = [s for s in telemetry.spans("oncewire.accept") if s.context.trace_id == trace_id]
    assert accept.parent is not None and accept.parent.span_id == checkout.context.span_id
    assert accept.attributes["oncewire.effect.key"] == "charge-1"
    assert accept.attributes["oncewire.effect.created"] is True
    attempts = {s.attributes["oncewire.effect.key"]: s for s in telemetry.spans("oncewire.attempt")}
    assert set(attempts) == {"charge-1", "untraced"}
    traced = attempts["charge-1"]
    assert traced.context.trace_id == trace_id
    assert traced.parent is not None and traced.parent.span_id == checkout.context.span_id
    assert traced.attributes["oncewire.attempt.outcome"] == "done"
    assert traced.attributes["oncewire.attempt.redelivery"] is False
    assert traced.start_time is not None and traced.end_time is not None
    assert traced.start_time <= traced.end_time
    untraced = attempts["untraced"]
    assert untraced.parent is None and untraced.context.trace_id != trace_id


def test_counters_by_outcome_match_the_attempt_history(
    store_url: str, telemetry: Telemetry
) -> None:
    with Ledger(store_url) as ledger:
        ledger.accept("ok", "tool", {"do": "ok"})
        ledger.accept("no", "tool", {"do": "refuse"})
        ledger.accept("boom", "tool", {"do": "raise"}, max_attempts=2)

        def tool(attempt: Attempt) -> Any:
            if attempt.payload["do"] == "refuse":
                return Rejected("not allowed")
            if attempt.payload["do"] == "raise":
                raise RuntimeError("the tool crashed")
            return "fine"

        # The failing effect is retried after a short backoff, until it is dead.
        retry = RetryPolicy(base_seconds=0.01, cap_seconds=0.01, jitter=0.0)
        dispatcher = Dispatcher(ledger, {"tool": tool}, poll_seconds=0.05, retry=retry)
        dispatcher.run(until_idle=True, handle_signals=False)

    history = tables.rows(store_url, "SELECT outcome, redelivery FROM oncewire_attempts")
    expected: dict[tuple[str, bool], int] = {}
    for outcome, redelivery in history:
        key = (str(outcome), bool(redelivery))
        expected[key] = expected.get(key, 0) + 1
    assert expected == {
        ("done", False): 1,
        ("rejected", False): 1,
        ("error", False): 1,
        ("error", True): 1,
    }
    counted = {
        (a["oncewire.attempt.outcome"], a["oncewire.attempt.redelivery"]): value
        for a, value in telemetry.points("oncewire.attempts")
    }
    assert counted == expected
    assert sum(v for _, v in telemetry.points("oncewire.dispatch.claims")) == len(history)
    assert sum(v for _, v in telemetry.points("oncewire.dispatch.redeliveries")) == 1
    durations = {
        a["oncewire.attempt.outcome"]: v for a, v in telemetry.points("oncewire.attempt.duration")
    }
    assert durations == {"done": 1, "rejected": 1, "error": 2}
    failed = [
        s for s in telemetry.spans("oncewire.attempt") if s.status.status_code.name == "ERROR"
    ]
    assert len(failed) == 2 and all(
        "the tool crashed" in (s.status.description or "") for s in failed
    )
    states = dict(tables.rows(store_url, "SELECT key, state FROM oncewire_effects"))
    assert states == {"ok": "done", "no": "rejected", "boom": "dead"}


def test_the_oldest_pending_effect_gauge_reads_the_store(
    store_url: str, telemetry: Telemetry
) -> None:
    clock = ManualClock(1_800_000_000.0)
    with Ledger(store_url, clock=clock) as ledger:
        telemetry.instrumentation.watch(ledger)
        assert telemetry.points("oncewire.effects.oldest_pending_age") == []
        ledger.accept("a", "mail", {})
        clock.advance(30)
        ledger.accept("b", "mail", {})
        ledger.accept("c", "sms", {})
        clock.advance(12)
        ages = {
            a["oncewire.effect.kind"]: v
            for a, v in telemetry.points("oncewire.effects.oldest_pending_age")
        }
        assert ages == {"mail": 42.0, "sms": 12.0}
        Dispatcher(ledger, {"mail": lambda a: None}).run(until_idle=True, handle_signals=False)
        ages = {
            a["oncewire.effect.kind"]: v
            for a, v in telemetry.points("oncewire.effects.oldest_pending_age")
        }
        assert ages == {"sms": 12.0}
    assert dict(tables.rows(store_url, "SELECT key, state FROM oncewire_effects")) == {
        "a": "done",
        "b": "done",
        "c": "pending",
    }


def test_run_commands_are_spans_by_workflow_command_and_result(
    store_url: str, telemetry: Telemetry
) -> None:
    with Ledger(store_url) as ledger:
        runs = ledger.runs
        runs.start("r1", key="start-1", scope="s1")
        runs.start("r1", key="start-1", scope="s1")  # replayed
        with pytest.raises(TransitionRefused):
            runs.execute("r1", "terminate", {"outcome": "approved"}, key="t-1")
    events = tables.rows(
        store_url, "SELECT type FROM oncewire_run_events WHERE run_id = ?", ("r1",)
    )
    assert len(events) == 1
    seen = [
        (s.name, s.attributes["oncewire.run.result"], s.attributes["oncewire.run.workflow"])
        for s in telemetry.spans("oncewire.run.start") + telemetry.spans("oncewire.run.terminate")
    ]
    assert seen == [
        ("oncewire.run.start", "written", "review"),
        ("oncewire.run.start", "replayed", "review"),
        ("oncewire.run.terminate", "refused", "review"),
    ]
    counted = {
        (a["oncewire.run.command"], a["oncewire.run.result"]): v
        for a, v in telemetry.points("oncewire.run.commands")
    }
    assert counted == {
        ("start", "written"): 1,
        ("start", "replayed"): 1,
        ("terminate", "refused"): 1,
    }


def test_reply_operations_are_spans_one_per_platform_call(
    store_url: str, tmp_path: Path, telemetry: Telemetry
) -> None:
    from oncewire.lab.suites.replies_rig import Rig, reply_text

    text = reply_text("A-otel", "a streamed answer " * 20)
    with Rig(tmp_path / "rig", clock=ManualClock(), db=store_url) as rig:
        admitted = rig.admit("fk_tg", "chat-otel", "in-1")
        rig.answer(admitted.inbound.id, text, mode="many")
        journal = rig.platforms["fk_tg"].journal
    calls = [
        json.loads(line)["event"]
        for line in journal.read_text().splitlines()
        if json.loads(line)["event"] in ("send", "edit", "delete")
    ]
    assert calls, "the answer reached the platform"
    spans = [
        s for s in telemetry.exporter.get_finished_spans() if s.name.startswith("oncewire.reply.")
    ]
    assert sorted(s.attributes["oncewire.reply.operation"] for s in spans) == sorted(calls)
    assert {s.attributes["oncewire.reply.outcome"] for s in spans} == {"delivered"}
    counted = sum(v for _, v in telemetry.points("oncewire.reply.operations"))
    assert counted == len(calls)


# A dispatcher whose sink writes a marker and then hangs: the test SIGKILLs it mid-attempt.
HANGING_WORKER = """
import pathlib, sys, time
from oncewire import Dispatcher, Ledger

url, marker = sys.argv[1], pathlib.Path(sys.argv[2])

def hang(attempt):
    marker.write_text(attempt.key)
    time.sleep(600)

Dispatcher(Ledger(url), {"charge": hang}, batch_size=1, poll_seconds=0.05).run()
"""


def test_an_attempt_redelivered_after_a_sigkill_is_a_span_with_redelivery(
    store_url: str,
    tmp_path: Path,
    telemetry: Telemetry,
    python_child: Callable[..., subprocess.Popen[str]],
) -> None:
    with (
        Ledger(store_url) as ledger,
        telemetry.tracer.start_as_current_span("checkout") as checkout,
    ):
        ledger.accept("charge-9", "charge", {"order": 9})
    marker = tmp_path / "started"
    child = python_child(HANGING_WORKER, store_url, str(marker))
    wait_for(marker.exists, timeout=60, what="the child's sink to be called")
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert tables.rows(store_url, "SELECT state FROM oncewire_effects") == [("claimed",)]

    with Ledger(store_url) as ledger:
        Dispatcher(ledger, {"charge": lambda a: {"charged": a.redelivery}}).run(
            until_idle=True, handle_signals=False
        )
    assert tables.rows(store_url, "SELECT state, result FROM oncewire_effects") == [
        ("done", '{"charged":true}')
    ]
    history = tables.rows(
        store_url, "SELECT fence, outcome, redelivery FROM oncewire_attempts ORDER BY fence"
    )
    assert [(o, bool(r)) for _, o, r in history] == [("owner_died", False), ("done", True)]
    (span,) = telemetry.spans("oncewire.attempt")
    assert span.attributes["oncewire.attempt.redelivery"] is True
    assert span.attributes["oncewire.attempt.outcome"] == "done"
    assert span.attributes["oncewire.attempt.fence"] == history[-1][0]
    assert span.context.trace_id == checkout.get_span_context().trace_id
    assert sum(v for _, v in telemetry.points("oncewire.dispatch.released")) == 1
    assert sum(v for _, v in telemetry.points("oncewire.dispatch.redeliveries")) == 1


def test_oncewire_imports_without_opentelemetry() -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # any import of it fails
        "import oncewire, oncewire.cli, oncewire.dispatch.dispatcher\n"
        "assert 'oncewire.otel' not in sys.modules\n"
        "try:\n"
        "    import oncewire.otel\n"
        "except ImportError:\n"
        "    print('refused')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"
