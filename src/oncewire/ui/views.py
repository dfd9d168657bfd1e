"""What each page shows, read through the ledgers' readers (the ones the command line uses).

Each function takes an open :class:`~oncewire.ledger.Ledger` and returns plain data for one
template. Nothing here writes, and nothing here computes a state the store does not hold: a
count is a count the store returned, an age is the store's ``created_at`` against the ledger's
clock, and where a reader is bounded (runs counted for the overview, attempts for the chart)
the page says how far it read.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections import Counter
from typing import Any

from oncewire.core.extras import refusal

try:
    from markupsafe import Markup
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise refusal("ui", "oncewire ui", exc) from exc

from oncewire.core.clock import iso_utc
from oncewire.core.errors import ConfigurationError
from oncewire.ledger import Ledger
from oncewire.storage.records import EffectState
from oncewire.storage.replies import ReplyState
from oncewire.ui import charts

__all__ = [
    "EFFECT_COLOURS",
    "PAGE",
    "age",
    "chat_detail",
    "chats",
    "effect_detail",
    "effects_page",
    "overview",
    "receipts_page",
    "run_detail",
    "runs_page",
    "when",
]

PAGE = 50  # rows per page of a list
RUNS_COUNTED = 5000  # runs read for the overview's count by status
ATTEMPTS_CHARTED = 20_000  # attempts read for the overview's chart
WINDOW_MINUTES = 60  # the chart's span, one column per minute

EFFECT_COLOURS = {
    "pending": "#2563eb",
    "claimed": "#7c3aed",
    "uncertain": "#d97706",
    "done": "#16a34a",
    "rejected": "#dc2626",
    "dead": "#111827",
    "cancelled": "#6b7280",
}
OP_COLOURS = {
    "planned": "#9ca3af",
    "in_flight": "#7c3aed",
    "acked": "#16a34a",
    "refused": "#dc2626",
    "ambiguous": "#d97706",
    "gone": "#111827",
}


def when(ts: float | None) -> str:
    """A Unix time as the command line prints it: ISO 8601, UTC, milliseconds, the zone (one
    that is no date, as ``"<seconds> (not a date)"``)."""
    if ts is None:
        return ""
    return iso_utc(ts)


def age(seconds: float) -> str:
    """A duration for a person: ``42 s``, ``7 min 3 s``, ``2 h 5 min``, ``3 d 4 h``; one no
    clock can measure (from a time that is no date) as ``?``."""
    if not -math.inf < seconds < math.inf:  # NaN too
        return "?"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def overview(ledger: Ledger) -> dict[str, Any]:
    """Effects by state, the oldest waiting effect per kind, attempts over the last hour,
    the effects waiting for an operator, runs by status and undelivered replies."""
    now = ledger.clock.now()
    counts = ledger.effects.counts()
    by_state = [(s.value, counts.get(s, 0)) for s in EffectState]
    waiting = [
        {"kind": kind, "count": n, "oldest": when(oldest), "age": age(now - oldest)}
        for kind, (n, oldest) in sorted(
            ledger.store.waiting_kinds().items(), key=lambda item: item[1][1]
        )
    ]
    start = (int(now) // 60 - WINDOW_MINUTES + 1) * 60
    recent = ledger.store.recent_attempts(since=start, limit=ATTEMPTS_CHARTED)
    first, again = [0] * WINDOW_MINUTES, [0] * WINDOW_MINUTES
    for attempt in recent:
        offset = attempt.finished_at - start  # a time that is no date goes in the last slot
        slot = WINDOW_MINUTES - 1
        if math.isfinite(offset):
            slot = min(WINDOW_MINUTES - 1, max(0, int(offset) // 60))
        (again if attempt.redelivery else first)[slot] += 1
    labels = [
        dt.datetime.fromtimestamp(start + 60 * i, dt.UTC).strftime("%H:%M")
        for i in range(WINDOW_MINUTES)
    ]
    attention = ledger.effects.list(
        [EffectState.DEAD, EffectState.REJECTED], limit=PAGE, newest_first=True
    )
    try:
        runs = ledger.runs.list(limit=RUNS_COUNTED)
        runs_error = ""
    except ConfigurationError as exc:  # a keyed run and no key (or another): say so, here only
        runs, runs_error = [], f"{exc} (start oncewire ui with the key in --key-env's variable)"
    run_counts = Counter(r.status + (" (abandoned)" if r.abandoned_at else "") for r in runs)
    reply_counts = ledger.replies.counts()
    undelivered = ledger.replies.undelivered(limit=PAGE)
    return {
        "effects_total": sum(counts.values()),
        "by_state": by_state,
        "state_chart": charts.bars("effects by state", by_state, colours=EFFECT_COLOURS),
        "waiting": waiting,
        "attempt_chart": charts.columns(
            "attempts per minute, last hour (UTC)",
            labels,
            [
                charts.Series("first deliveries", "#2563eb", first),
                charts.Series("redeliveries", "#d97706", again),
            ],
        ),
        "attempts_in_window": len(recent),
        "attempts_capped": len(recent) >= ATTEMPTS_CHARTED,
        "redeliveries_in_window": sum(again),
        "attention": [_effect_row(e) for e in attention],
        "attention_total": counts.get(EffectState.DEAD, 0) + counts.get(EffectState.REJECTED, 0),
        "runs_by_status": sorted(run_counts.items()),
        "runs_counted": len(runs),
        "runs_capped": len(runs) >= RUNS_COUNTED,
        "runs_error": runs_error,
        "replies_by_state": [(s.value, reply_counts.get(s, 0)) for s in ReplyState],
        "undelivered": [_reply_row(r, now) for r in undelivered],
        "undelivered_total": reply_counts.get(ReplyState.COMMITTED, 0),
    }


def _effect_row(e: Any) -> dict[str, Any]:
    return {
        "id": e.id,
        "key": e.key,
        "kind": e.kind,
        "state": str(e.state),
        "attempts": f"{e.attempts}/{e.max_attempts}",
        "maybe_sent": e.maybe_sent,
        "created": when(e.created_at),
        "updated": when(e.updated_at),
        "last_error": e.last_error or "",
    }


def _reply_row(r: Any, now: float) -> dict[str, Any]:
    return {
        "id": r.id,
        "inbound_id": r.inbound_id,
        "platform": r.request.platform,
        "chat": r.request.chat,
        "state": str(r.state),
        "marked": r.marked,
        "attempts": r.attempts,
        "age": age(now - r.created_at),
        "last_error": r.last_error or "",
    }


def effects_page(
    ledger: Ledger, state: str | None, kind: str | None, after: int | None
) -> dict[str, Any]:
    """One page of effects, newest first, as ``oncewire effects list`` pages them."""
    states = [EffectState(state)] if state else None
    found = ledger.effects.list(
        states, kind=kind, limit=PAGE + 1, newest_first=True, before_id=after
    )
    more, found = len(found) > PAGE, found[:PAGE]
    counts = ledger.effects.counts(kind=kind)
    total = sum(n for s, n in counts.items() if state is None or s.value == state)
    return {
        "rows": [_effect_row(e) for e in found],
        "total": total,
        "next_after": found[-1].id if more and found else None,
        "state": state or "",
        "kind": kind or "",
        "after": after,
        "states": [s.value for s in EffectState],
    }


def effect_detail(ledger: Ledger, key: str) -> dict[str, Any]:
    """An effect in full, with every attempt its history holds."""
    effect = ledger.effects.get(key)
    history = ledger.effects.attempts(key)
    data = effect.as_dict()
    return {
        "effect": data,
        "payload": json.dumps(data.get("payload"), ensure_ascii=False, indent=2, sort_keys=True),
        "result": None
        if data.get("result") is None
        else json.dumps(data["result"], ensure_ascii=False, indent=2, sort_keys=True),
        "times": {
            name: when(getattr(effect, name))
            for name in ("created_at", "updated_at", "not_before", "deadline", "lease_expires_at")
        },
        "attempts": [
            {
                **a.as_dict(),
                "started": when(a.started_at),
                "finished": when(a.finished_at),
                "ms": ""
                if a.started_at is None
                else f"{(a.finished_at - a.started_at) * 1000:.0f}",
            }
            for a in history
        ],
        "retryable": effect.state
        in (EffectState.DEAD, EffectState.REJECTED, EffectState.CANCELLED),
        "cancellable": effect.state
        in (EffectState.PENDING, EffectState.CLAIMED, EffectState.UNCERTAIN),
    }


def receipts_page(ledger: Ledger, after: str) -> dict[str, Any]:
    """Receipts by key, a page at a time (a receiver's records in the same database)."""
    found = ledger.store.list_receipts(limit=PAGE + 1, after_key=after)
    more, found = len(found) > PAGE, found[:PAGE]
    return {
        "rows": [
            {
                "key": r.key,
                "digest": r.digest[:12],
                "result": r.result_json or "",
                "created": when(r.created_at),
                "expires": when(r.expires_at),
            }
            for r in found
        ],
        "next_after": found[-1].key if more and found else None,
        "after": after,
    }


def chats(ledger: Ledger, after: int) -> dict[str, Any]:
    """Inbound messages by id, each with its reply's state."""
    now = ledger.clock.now()
    found = ledger.inbound.list(limit=PAGE + 1, after_id=after)
    more, found = len(found) > PAGE, found[:PAGE]
    rows = []
    for m in found:
        reply = ledger.replies.for_inbound(m.id)
        rows.append(
            {
                "id": m.id,
                "platform": m.platform,
                "chat": m.chat,
                "thread": m.thread,
                "message": m.platform_message_id,
                "status": str(m.status),
                "deliveries": m.deliveries,
                "text": _inbound_text(m.payload_json),
                "reply": None if reply is None else _reply_row(reply, now),
            }
        )
    return {"rows": rows, "next_after": found[-1].id if more and found else None, "after": after}


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis saying it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _inbound_text(payload_json: str) -> str:
    try:
        payload = json.loads(payload_json)
    except ValueError:
        return _clip(payload_json, 200)
    if isinstance(payload, dict) and isinstance(payload.get("text"), str):
        return _clip(str(payload["text"]), 200)
    return _clip(payload_json, 200)


def chat_detail(ledger: Ledger, inbound_id: int) -> dict[str, Any]:
    """An inbound message, its reply and the reply's wire operations on a timeline."""
    now = ledger.clock.now()
    message = ledger.inbound.get(inbound_id)
    reply = ledger.replies.for_inbound(inbound_id)
    ops = [] if reply is None else ledger.replies.ops(reply.id)
    chart = Markup("")
    if ops:
        points = [
            (
                op.updated_at,
                "notice" if op.slot < 0 else f"message {op.slot + 1}",
                f"#{op.seq} {op.kind} {op.state}{' marked' if op.marked else ''}",
                str(op.state),
            )
            for op in ops
        ]
        chart = charts.timeline("wire operations", points, colours=OP_COLOURS)
    return {
        "message": {**message.as_dict(), "text": _inbound_text(message.payload_json)},
        "received": when(message.created_at),
        "reply": None if reply is None else {**_reply_row(reply, now), "text": reply.final_text},
        "ops": [
            {
                "seq": op.seq,
                "slot": op.slot,
                "kind": str(op.kind),
                "state": str(op.state),
                "marked": op.marked,
                "message_id": op.message_id or "",
                "error": op.error or "",
                "body": op.body,
                "created": when(op.created_at),
                "updated": when(op.updated_at),
            }
            for op in ops
        ],
        "chart": chart,
        "colours": OP_COLOURS,
    }


def runs_page(ledger: Ledger, status: str | None, after: str) -> dict[str, Any]:
    """Runs as stored, by id, a page at a time (the detail page verifies one)."""
    found = ledger.runs.list(status=[status] if status else [], limit=PAGE + 1, after_run_id=after)
    more, found = len(found) > PAGE, found[:PAGE]
    return {
        "rows": [
            {
                "run_id": r.run_id,
                "scope": r.scope,
                "branch": r.branch,
                "status": r.status,
                "abandoned": r.abandoned_at is not None,
                "reason": r.terminal_reason or r.abandon_reason or "",
                "events": r.head_seq,
                "owner": r.owner or "",
                "updated": when(r.updated_at),
            }
            for r in found
        ],
        "next_after": found[-1].run_id if more and found else None,
        "status": status or "",
        "after": after,
    }


def run_detail(ledger: Ledger, run_id: str) -> dict[str, Any]:
    """A run verified, with its events, phases, its scope's checkpoints and forks, and what
    reconciliation reported about it; read in one snapshot of the store."""
    with ledger.runs.snapshot():
        run = ledger.runs.get(run_id)
        events = ledger.runs.events(run_id)
        verification = ledger.runs.verify(run_id)[0]
        phases = ledger.runs.phases(run_id)
        checkpoints = ledger.store.list_checkpoints(run.scope)
        branches = ledger.store.list_branches(run.scope)
        reports = ledger.runs.reports(limit=PAGE, subject_id=run_id)
    return {
        "run": run,
        "times": {n: when(getattr(run, n)) for n in ("created_at", "finished_at", "abandoned_at")},
        "lease_until": when(run.lease_expires_at),
        "verification": verification,
        "events": [
            {
                "seq": e.seq,
                "cursor": e.cursor,
                "type": e.type,
                "key": e.key,
                "terminal": e.terminal,
                "at": when(e.at),
                "hash": e.hash[:16],
                "payload": _clip(json.dumps(e.payload, ensure_ascii=False, sort_keys=True), 300),
            }
            for e in events
        ],
        "phases": phases,
        "checkpoints": [
            {
                "id": c.checkpoint_id,
                "branch": c.branch,
                "cursor": c.cursor,
                "reason": c.reason,
                "at": when(c.created_at),
            }
            for c in checkpoints
        ],
        "branches": [
            {"branch": b.branch, "parent": b.parent or "", "at": when(b.created_at)}
            for b in branches
        ],
        "reports": [
            {
                "at": when(r.created_at),
                "subject": r.subject,
                "outcome": r.outcome,
                "status": r.status or "",
                "reason": r.reason or "",
                "owner": r.owner,
                "error": r.error or "",
            }
            for r in reports
        ],
    }
