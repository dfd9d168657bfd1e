"""The run ledger's command pipeline, as an in-package API over a :class:`RunContext`.

:class:`~oncewire.runs.service.Runs` owns one context (its store, clock, chain key and the
outbox its action ledger accepts through); the commands in ``service``, reconciliation in
``recovery``, reverts in ``branches`` and key adoption in ``keys`` all go through the functions
here, so there is one way to verify a run's head, append an event, release a run, audit a
history and replay a command. Nothing here commits: every ``*_in_tx`` function writes in the
caller's transaction. A command written, refused by its workflow or replayed is observed here
(:mod:`oncewire.core.observe`); "written" means written in the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json_unchecked, digest_json, digest_unchecked
from oncewire.core.clock import Clock
from oncewire.core.errors import (
    HistoryHidden,
    HistoryTampered,
    RevertBarrierHeld,
    RunConflict,
    TransitionRefused,
)
from oncewire.core.observe import LISTENERS, RUN_COMMAND, emit
from oncewire.effects.outbox import ACCEPT_BEFORE_COMMIT, Effects
from oncewire.runs.chain import event_hash
from oncewire.runs.keys import chain_key as _chain_key
from oncewire.runs.keys import pin_problem
from oncewire.runs.machine import Refusal, Rows, Step, apply_command
from oncewire.runs.machine import workflow as _workflow
from oncewire.runs.records import CommandResult, Verification
from oncewire.runs.verify import Audit
from oncewire.runs.verify import audit as _audit
from oncewire.runs.views import event_view, run_view
from oncewire.storage import RunStore, Transaction
from oncewire.storage.runs import EventRow, RunAppend, RunRow

__all__ = [
    "COMMAND_AFTER_COMMIT",
    "COMMAND_BEFORE_COMMIT",
    "RunContext",
    "abandon_in_tx",
    "accept_effect_in_tx",
    "append_in_tx",
    "audit",
    "chain_key",
    "command_in_own_tx",
    "effect_acceptor",
    "refuse_barrier",
    "refuse_released",
    "refuse_used_ids",
    "replay",
    "require_audit",
    "verified_head",
]

_STATE_TAIL = '"state":"'

# Hit by whoever commits a command in a transaction of its own (the caller of an ``_in_tx``
# command commits, and names its own windows).
COMMAND_BEFORE_COMMIT = crash.register(
    "runs.command_before_commit", "a run command's event and row are written but not committed"
)
COMMAND_AFTER_COMMIT = crash.register(
    "runs.command_after_commit", "a run command is committed; the caller has not heard back"
)


def command_in_own_tx(
    store: RunStore, write: Callable[[Transaction], CommandResult]
) -> CommandResult:
    """Run one ``_in_tx`` command (``write``) in a transaction of its own, hitting the crash
    points on either side of its commit (a replay writes nothing, and hits neither)."""
    with store.transaction() as tx:
        result = write(tx)
        if not result.replayed:
            COMMAND_BEFORE_COMMIT.hit()
    if not result.replayed:
        COMMAND_AFTER_COMMIT.hit()
    return result


@dataclass(frozen=True, slots=True)
class RunContext:
    """What every step of the pipeline needs: the store, the clock, the chain key (held
    outside the database; None for a keyless chain) and the outbox of the action ledger."""

    store: RunStore
    clock: Clock
    key: bytes | None
    effects: Effects

    def now(self) -> float:
        return self.clock.now()


def _committed_state(payload_json: str) -> str | None:
    """The state digest an event's payload commits to.

    The payload is canonical JSON and ``state`` is its last key, so the digest is the tail of
    the text; the (already verified) hash covers those bytes. Anything else is parsed.
    """
    tail = payload_json[-76:]
    if tail.startswith(_STATE_TAIL) and tail.endswith('"}') and len(tail) == 76:
        return tail[9:73]
    try:
        value = json.loads(payload_json)
    except ValueError:
        return None
    committed = value.get("state") if isinstance(value, dict) else None
    return committed if isinstance(committed, str) else None


def chain_key(ctx: RunContext, row: RunRow) -> bytes | None:
    """The key ``row``'s chain is verified with; :class:`ConfigurationError` when the context's
    key does not fit it (read inside the caller's transaction or snapshot)."""
    pin = ctx.store.run_key_pin(row.run_id) if row.chain == "sha256" and ctx.key else None
    return _chain_key(row, ctx.key, pin)


def audit(ctx: RunContext, row: RunRow, *, snapshots: Sequence[int] = ()) -> Audit:
    """Audit ``row`` against the events and projections read now: call it inside a transaction
    or snapshot that ``row`` was read in."""
    store = ctx.store
    with store.read_snapshot():
        pin = store.run_key_pin(row.run_id) if row.chain == "sha256" and ctx.key else None
        chain = _chain_key(row, ctx.key, pin)
        events = store.run_events(row.run_id)
        projections = store.run_projections(row.run_id)
    result = _audit(row, events, projections, chain, snapshots=snapshots)
    if pin is not None and ctx.key and result.ok:
        problem = pin_problem(ctx.key, row, pin)
        if problem is not None:
            verification = Verification(
                row.run_id, False, len(events), row.head_seq, problem, row.status
            )
            return Audit(verification, None, {})
    return result


def require_audit(ctx: RunContext, row: RunRow, *, snapshots: Sequence[int] = ()) -> Audit:
    """:func:`audit`, refusing with :class:`HistoryTampered` a history that fails it."""
    result = audit(ctx, row, snapshots=snapshots)
    if not result.ok:
        v = result.verification
        raise HistoryTampered(
            f"run {row.run_id!r} failed verification at event {v.first_bad_seq}: {v.reason}; "
            "it authorises nothing",
            run_id=row.run_id,
            seq=v.first_bad_seq,
            reason=v.reason,
        )
    return result


def refuse_released(row: RunRow) -> None:
    """An abandoned run, or one hidden by a revert, authorises nothing."""
    if row.abandoned_at is not None:
        raise HistoryHidden(
            f"run {row.run_id!r} was abandoned ({row.abandon_reason}): it authorises nothing",
            run_id=row.run_id,
            reason=row.abandon_reason,
        )
    if row.hidden:
        raise HistoryHidden(
            f"run {row.run_id!r} lies in a reverted branch tail: it authorises nothing",
            run_id=row.run_id,
            reason="reverted",
        )


def refuse_barrier(ctx: RunContext, tx: Transaction, scope: str, what: str) -> None:
    """:class:`RevertBarrierHeld` while a revert holds ``scope``."""
    barrier = ctx.store.held_barrier_in_tx(tx, scope)
    if barrier is not None:
        raise RevertBarrierHeld(
            f"cannot {what}: revert {barrier.operation_id!r} holds scope {scope!r} "
            f"({barrier.state}) and requires recovery first",
            scope=scope,
            operation_id=barrier.operation_id,
            state=barrier.state,
        )


def verified_head(ctx: RunContext, row: RunRow, head: EventRow | None) -> dict[str, Any]:
    """Incremental verification: the head event is intact and the row is its state."""

    def tampered(reason: str) -> HistoryTampered:
        return HistoryTampered(
            f"run {row.run_id!r} failed verification at event {row.head_seq}: {reason}; "
            "it authorises nothing",
            run_id=row.run_id,
            seq=row.head_seq,
            reason=reason,
        )

    chain = chain_key(ctx, row)  # a key that does not fit: ConfigurationError, no verdict
    if head is None or head.seq != row.head_seq or head.run_id != row.run_id:
        raise tampered("its head event is missing")
    computed = event_hash(chain, row.run_id, head.seq, head.type, head.prev_hash, head.payload_json)
    if computed != head.hash or head.hash != row.head_hash:
        raise tampered("its head event's hash does not match")
    if digest_json(row.state_json) != _committed_state(head.payload_json):
        raise tampered("the run row is not the state its head event commits to")
    try:
        state: dict[str, Any] = json.loads(row.state_json)
    except ValueError:
        raise tampered("its row's state is not JSON") from None
    if not isinstance(state, dict) or state.get("status") != row.status:
        raise tampered("the run row's status is not its state's")
    return state


def replay(ctx: RunContext, row: RunRow, prior: EventRow, request_digest: str) -> CommandResult:
    """The outcome a command's key already has: the original event and the run as it stood
    after it (its whole history verified first), or :class:`RunConflict` for another
    request under that key. Nothing is written."""
    if prior.request_digest != request_digest:
        raise RunConflict(
            f"key {prior.idempotency_key!r} of run {row.run_id!r} is bound to request "
            f"{prior.request_digest[:12]}…, not {request_digest[:12]}…; nothing was written",
            run_id=row.run_id,
            key=prior.idempotency_key,
            stored_digest=prior.request_digest,
            offered_digest=request_digest,
        )
    refuse_released(row)
    result = require_audit(ctx, row, snapshots=(prior.seq,))
    if LISTENERS:
        command = json.loads(prior.payload_json).get("command")
        _observe(row, str(command), "replayed", prior.type)
    return CommandResult(run_view(row, result.states[prior.seq]), event_view(prior), True)


def _observe(row: RunRow, command: str, result: str, event: str | None) -> None:
    emit(
        RUN_COMMAND,
        {
            "workflow": row.workflow,
            "command": command,
            "result": result,
            "run_id": row.run_id,
            "event": event,
        },
    )


def refuse_used_ids(ctx: RunContext, tx: Transaction, run_id: str, seq: int, rows: Rows) -> None:
    """A review, repair, finding or action id names one thing for the whole run: a command
    that would open one again (under another idempotency key) is refused here, before it
    writes, so the history and the rows that project it never disagree."""
    phases = [p.phase_id for p in rows.phases if p.status == "open" and p.opened_seq == seq]
    actions = [a.action_id for a in rows.actions if a.proposed_seq == seq]
    findings = [f.finding_id for f in rows.findings]
    if not (phases or actions or findings):
        return
    used = ctx.store.used_ids_in_tx(tx, run_id, phases=phases, findings=findings, actions=actions)
    if used:
        kind, name, at = min(used)  # the same id is named whatever order the rows came in
        raise RunConflict(
            f"run {run_id!r}: {kind} id {name!r} is already used (by event {at}); "
            "an id names one thing for the whole run; nothing was written",
            run_id=run_id,
            id=name,
            kind=kind,
            seq=at,
        )


def append_in_tx(
    ctx: RunContext,
    tx: Transaction,
    row: RunRow,
    state: dict[str, Any],
    command: str,
    request: dict[str, Any],
    *,
    key: str,
    request_digest: str,
    owner: str | None,
    fence: int,
    lease_expires_at: float | None,
) -> tuple[EventRow, RunRow, dict[str, Any]]:
    """Apply one command to ``state`` (in place) and write its event; returns the stored
    event, the new row and the state."""
    flow = _workflow(row.workflow)
    now = ctx.now()
    seq = row.head_seq + 1
    try:
        transition, rows = apply_command(
            flow, state, command, request, Step(row.run_id, seq, now, owner)
        )
    except Refusal as exc:
        if LISTENERS:
            _observe(row, command, "refused", None)
        raise TransitionRefused(
            f"run {row.run_id!r}: {exc.reason}",
            run_id=row.run_id,
            command=command,
            status=row.status,
            reason=exc.reason,
        ) from None
    refuse_used_ids(ctx, tx, row.run_id, seq, rows)
    # The request passed the canonical check (digest) on its way in: encode it fast.
    state_json = canonical_json_unchecked(state)
    payload_json = canonical_json_unchecked(
        {
            "key": key,
            "digest": request_digest,
            "command": command,
            "request": request,
            "at": now,
            "by": owner,
            "state": digest_json(state_json),
        }
    )
    # The run's own algorithm (a keyless run pinned under a key stays keyless).
    chain = ctx.key if row.chain == "hmac-sha256" else None
    own_hash = event_hash(chain, row.run_id, seq, transition.event, row.head_hash, payload_json)
    event = EventRow(
        id=0,
        run_id=row.run_id,
        scope=row.scope,
        branch=row.branch,
        seq=seq,
        type=transition.event,
        idempotency_key=key,
        request_digest=request_digest,
        terminal=transition.terminal,
        payload_json=payload_json,
        prev_hash=row.head_hash,
        hash=own_hash,
        at=now,
    )
    terminal = state["status"] in flow.terminal_statuses
    new_row = RunRow(  # not dataclasses.replace: this is the hot path of every command
        row.run_id,
        row.scope,
        row.branch,
        row.turn,
        row.workflow,
        row.chain,
        str(state["status"]),
        state["reason"] if terminal else None,
        state_json,
        seq,
        own_hash,
        owner,
        fence,
        None if terminal else lease_expires_at,
        row.created_at,
        now,
        state["finished_at"] if terminal else None,
        row.abandoned_at,
        row.abandon_reason,
        row.hidden,
        row.key_id,
    )
    stored = ctx.store.append_run_event_in_tx(
        tx, RunAppend(event, new_row, rows.phases, rows.findings, rows.actions)
    )
    if LISTENERS:
        _observe(row, command, "written", transition.event)
    return stored, new_row, state


def abandon_in_tx(ctx: RunContext, tx: Transaction, row: RunRow, *, reason: str) -> None:
    """Release an active run without a terminal. Its history records the release (an
    ``abandon`` event) when its head verifies; a run whose head does not verify is released on
    its row alone, so that its evidence is never touched."""
    try:
        state: dict[str, Any] | None = verified_head(
            ctx, row, ctx.store.event_at_in_tx(tx, row.run_id, row.head_seq)
        )
    except HistoryTampered:
        state = None
    if state is not None:
        request = {"reason": reason}
        append_in_tx(
            ctx,
            tx,
            row,
            state,
            "abandon",
            request,
            key=f"abandon:{row.fence}:{row.head_seq}",
            request_digest=digest_unchecked({"command": "abandon", "request": request}),
            owner=row.owner,
            fence=row.fence,
            lease_expires_at=None,
        )
    ctx.store.abandon_run_in_tx(tx, row.run_id, reason=reason, now=ctx.now())


def accept_effect_in_tx(
    ctx: RunContext,
    tx: Transaction,
    key: str,
    kind: str,
    payload: Any,
    *,
    max_attempts: int | None = None,
    deadline_seconds: float | None = None,
) -> None:
    """Accept an effect into the outbox inside a run command's transaction, through the
    outbox's one accept path (its limits, its ``max_payload_bytes``, its crash point): the
    same key and payload again is a no-op; another payload raises :class:`PayloadConflict`,
    another kind :class:`KindConflict`. ``max_attempts`` (the outbox's default when None) and
    ``deadline_seconds`` are the effect's."""
    options: dict[str, Any] = {"deadline_seconds": deadline_seconds}
    if max_attempts is not None:
        options["max_attempts"] = max_attempts
    _, created = ctx.effects.accept_in_tx(tx, key, kind, payload, **options)
    if created:  # the command's event and the effect are written; neither is committed
        ACCEPT_BEFORE_COMMIT.hit()


def effect_acceptor(
    ctx: RunContext,
    key: str | None,
    dispatch: tuple[str, Any] | None,
    *,
    max_attempts: int | None = None,
    deadline_seconds: float | None = None,
) -> Callable[[Transaction], None] | None:
    """The ``also_in_tx`` of a proposal that dispatches: it accepts the effect
    ``dispatch=(effect_kind, payload)`` under ``key`` in the proposal's transaction, so both
    commit or neither. None when there is nothing to dispatch."""
    if dispatch is None or key is None:
        return None
    effect_kind, payload = dispatch
    accepted: str = key

    def accept(tx: Transaction) -> None:
        accept_effect_in_tx(
            ctx,
            tx,
            accepted,
            effect_kind,
            payload,
            max_attempts=max_attempts,
            deadline_seconds=deadline_seconds,
        )

    return accept
