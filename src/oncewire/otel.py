"""OpenTelemetry spans and metrics for oncewire: ``oncewire.otel.instrument()``.

Needs the ``otel`` extra (``opentelemetry-api`` and ``-sdk``); ``import oncewire`` never imports
this module. :func:`instrument` listens to :mod:`oncewire.core.observe` and turns each
observation into a span and metric points, and installs the trace-context source, so that an
effect accepted while a span is current stores that span's W3C ``traceparent`` and each of its
attempts' spans continues that trace (its parent is the accepting span, its trace id the same),
in whichever process the attempt runs.

What it records is what the observations say, no more: an accept span marks a write inside the
caller's transaction (the caller's own span says whether it committed); an attempt span is made
when the dispatcher learns the sink's outcome, with the sink call's start and end times from the
ledger's clock, so it is not current while the sink runs. The gauge of the oldest pending
effect is read from the store of each ledger given to ``ledgers`` or :meth:`Instrumentation.
watch`, at each collection; a store that cannot be read then is skipped and logged, never
reported as zero. The names are listed in docs/observability.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from oncewire.core.extras import refusal

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("otel", "oncewire.otel", exc) from exc

from oncewire.core import observe
from oncewire.core.clock import Clock

__all__ = ["Instrumentation", "instrument"]

log = logging.getLogger("oncewire.otel")

SCOPE = "oncewire"
_VERSION = "0.1.0"
# Attempt outcomes that mean the sink failed to say what happened (the span's status is ERROR).
_FAILED_OUTCOMES = frozenset({"error", "timeout", "undecodable"})
_propagator = TraceContextTextMapPropagator()


class _Store(Protocol):
    def waiting_kinds(self) -> dict[str, tuple[int, float]]: ...


class _Ledger(Protocol):
    """What the gauge reads of a :class:`~oncewire.Ledger`."""

    @property
    def store(self) -> _Store: ...

    @property
    def clock(self) -> Clock: ...


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)


def current_traceparent() -> str | None:
    """The W3C traceparent of the span current in this thread (None: no valid span)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


class Instrumentation:
    """One :func:`instrument` call: its listener, tracer, instruments and watched ledgers."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
    ) -> None:
        self.tracer = trace.get_tracer(SCOPE, _VERSION, tracer_provider=tracer_provider)
        meter = metrics.get_meter(SCOPE, _VERSION, meter_provider=meter_provider)
        self._accepted = meter.create_counter(
            "oncewire.effects.accepted", "{effect}", "Accept calls, by kind and whether new"
        )
        self._attempts = meter.create_counter(
            "oncewire.attempts", "{attempt}", "Attempts settled, by kind, outcome and redelivery"
        )
        self._duration = meter.create_histogram(
            "oncewire.attempt.duration", "s", "How long a sink call took, by kind and outcome"
        )
        self._claims = meter.create_counter(
            "oncewire.dispatch.claims", "{claim}", "Effects claimed by dispatchers"
        )
        self._redeliveries = meter.create_counter(
            "oncewire.dispatch.redeliveries",
            "{claim}",
            "Claims of effects whose earlier attempt may have landed",
        )
        self._released = meter.create_counter(
            "oncewire.dispatch.released",
            "{claim}",
            "Claims released: dead owners, expired leases, passed deadlines",
        )
        self._reply_ops = meter.create_counter(
            "oncewire.reply.operations", "{operation}", "Reply wire operations, by kind, outcome"
        )
        self._reply_duration = meter.create_histogram(
            "oncewire.reply.operation.duration", "s", "How long a platform call took"
        )
        self._run_commands = meter.create_counter(
            "oncewire.run.commands", "{command}", "Run commands, by workflow, command, result"
        )
        self._ledgers: list[_Ledger] = []
        self._ledgers_lock = threading.Lock()
        meter.create_observable_gauge(
            "oncewire.effects.oldest_pending_age",
            [self._oldest_pending],
            "s",
            "Age of the oldest pending or uncertain effect of each kind, read from the store",
        )
        self._stop_listening = observe.listen(self._observed)
        observe.set_traceparent_source(current_traceparent)
        self._handlers = {
            observe.ACCEPTED: self._on_accepted,
            observe.ATTEMPT: self._on_attempt,
            observe.CLAIMED: self._on_claimed,
            observe.RELEASED: self._on_released,
            observe.REPLY_OPERATION: self._on_reply_operation,
            observe.RUN_COMMAND: self._on_run_command,
        }
        self.active = True

    # -- control -----------------------------------------------------------------------------
    def watch(self, ledger: _Ledger) -> None:
        """Report ``ledger``'s oldest pending effect at each metric collection."""
        with self._ledgers_lock:
            if ledger not in self._ledgers:
                self._ledgers.append(ledger)

    def uninstrument(self) -> None:
        """Stop listening, and stop storing trace context with new effects. The gauge keeps
        answering the meter provider (an OpenTelemetry instrument cannot be removed): it
        reports nothing once this is called."""
        self._stop_listening()
        observe.set_traceparent_source(None)
        with self._ledgers_lock:
            self._ledgers.clear()
        self.active = False

    # -- observations ------------------------------------------------------------------------
    def _observed(self, name: str, attributes: Mapping[str, Any]) -> None:
        handler = self._handlers.get(name)
        if handler is not None:
            handler(attributes)

    def _on_accepted(self, a: Mapping[str, Any]) -> None:
        end = time.time_ns()
        attributes = {
            "oncewire.effect.key": a["key"],
            "oncewire.effect.kind": a["kind"],
            "oncewire.effect.created": bool(a["created"]),
        }
        span = self.tracer.start_span(
            "oncewire.accept",
            kind=SpanKind.PRODUCER,
            attributes=attributes,
            start_time=end - _ns(a["duration_seconds"]),
        )
        span.end(end_time=end)
        self._accepted.add(
            1, {"oncewire.effect.kind": a["kind"], "oncewire.effect.created": bool(a["created"])}
        )

    def _on_attempt(self, a: Mapping[str, Any]) -> None:
        parent = None
        if a.get("traceparent"):
            parent = _propagator.extract({"traceparent": a["traceparent"]})
        finished = a["finished_at"]
        started = a["started_at"] if a["started_at"] is not None else finished
        span = self.tracer.start_span(
            "oncewire.attempt",
            # An explicit (empty) context when none was stored: the attempt never joins
            # whatever span happens to be current on the dispatcher's thread.
            context=parent if parent is not None else otel_context.Context(),
            kind=SpanKind.CONSUMER,
            attributes={
                "oncewire.effect.key": a["key"],
                "oncewire.effect.kind": a["kind"],
                "oncewire.attempt.outcome": a["outcome"],
                "oncewire.attempt.state": a["state"],
                "oncewire.attempt.redelivery": bool(a["redelivery"]),
                "oncewire.attempt.number": a["attempt"],
                "oncewire.attempt.fence": a["fence"],
                "oncewire.attempt.started": bool(a["started"]),
                "oncewire.dispatch.owner": a["owner"],
            },
            start_time=_ns(started),
        )
        if a["outcome"] in _FAILED_OUTCOMES:
            span.set_status(Status(StatusCode.ERROR, a["reason"]))
        elif a["reason"]:
            span.set_attribute("oncewire.attempt.reason", a["reason"])
        span.end(end_time=_ns(finished))
        metric = {
            "oncewire.effect.kind": a["kind"],
            "oncewire.attempt.outcome": a["outcome"],
            "oncewire.attempt.redelivery": bool(a["redelivery"]),
        }
        self._attempts.add(1, metric)
        if a["started_at"] is not None:
            self._duration.record(
                max(0.0, finished - a["started_at"]),
                {"oncewire.effect.kind": a["kind"], "oncewire.attempt.outcome": a["outcome"]},
            )

    def _on_claimed(self, a: Mapping[str, Any]) -> None:
        self._claims.add(a["count"])
        if a["redeliveries"]:
            self._redeliveries.add(a["redeliveries"])

    def _on_released(self, a: Mapping[str, Any]) -> None:
        self._released.add(a["count"])

    def _on_reply_operation(self, a: Mapping[str, Any]) -> None:
        end = time.time_ns()
        attributes = {"oncewire.reply.operation": a["kind"], "oncewire.reply.outcome": a["outcome"]}
        span = self.tracer.start_span(
            "oncewire.reply." + a["kind"],
            kind=SpanKind.CLIENT,
            attributes={
                **attributes,
                "oncewire.reply.id": a["reply_id"],
                "oncewire.reply.slot": a["slot"],
                "oncewire.reply.marked": bool(a["marked"]),
            },
            start_time=end - _ns(a["duration_seconds"]),
        )
        if a["outcome"] in ("maybe_delivered", "rejected"):
            span.set_status(Status(StatusCode.ERROR, a["outcome"]))
        span.end(end_time=end)
        self._reply_ops.add(1, attributes)
        self._reply_duration.record(a["duration_seconds"], attributes)

    def _on_run_command(self, a: Mapping[str, Any]) -> None:
        attributes = {
            "oncewire.run.workflow": a["workflow"],
            "oncewire.run.command": a["command"],
            "oncewire.run.result": a["result"],
        }
        span = self.tracer.start_span(
            "oncewire.run." + a["command"],
            attributes={
                **attributes,
                "oncewire.run.id": a["run_id"],
                **({"oncewire.run.event": a["event"]} if a["event"] else {}),
            },
        )
        if a["result"] == "refused":
            span.set_status(Status(StatusCode.ERROR, "refused by the workflow"))
        span.end()
        self._run_commands.add(1, attributes)

    # -- the gauge ---------------------------------------------------------------------------
    def _oldest_pending(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._ledgers_lock:
            ledgers = list(self._ledgers)
        observations: list[Observation] = []
        for ledger in ledgers:
            try:
                waiting = ledger.store.waiting_kinds()
                now = ledger.clock.now()
            except Exception as exc:  # a store down at collection time: no reading, not zero
                log.warning("oldest pending effect not read: %s", exc)
                continue
            for kind, (_count, oldest) in sorted(waiting.items()):
                observations.append(
                    Observation(max(0.0, now - oldest), {"oncewire.effect.kind": kind})
                )
        return observations


def instrument(
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    *,
    ledgers: Iterable[_Ledger] = (),
) -> Instrumentation:
    """Turn oncewire's observations into OpenTelemetry spans and metrics, in this process.

    The providers default to the global ones. ``ledgers`` are watched for the
    ``oncewire.effects.oldest_pending_age`` gauge (more with :meth:`Instrumentation.watch`).
    Call it in every process that accepts or dispatches: the accepting process stores the
    trace context, the dispatching one makes the attempt spans. ``uninstrument()`` undoes it.
    """
    instrumentation = Instrumentation(tracer_provider, meter_provider)
    for ledger in ledgers:
        instrumentation.watch(ledger)
    return instrumentation
