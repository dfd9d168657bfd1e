"""The run ledger: ``ledger.runs``.

Every command is one transaction that appends one event to the run's hash chain and updates
the run row. A command carries an idempotency key; its request (timestamps left out) has a
digest. The same key with the same digest is a replay: the original outcome comes back and
nothing is written. The same key with another digest is a :class:`RunConflict`.

Before a command is applied the run is verified incrementally: the head event's hash is
recomputed and the run row must be the state that head event commits to. Terminals and replays
(which authorise a result) verify the whole history first. A run whose history fails
verification refuses everything with :class:`HistoryTampered` and is shown as ``failed`` with
reason ``safety_boundary``, the status the storage claimed kept beside it; its rows are never
rewritten.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from oncewire.core import crash
from oncewire.core.canonical import canonical_json, digest, digest_json
from oncewire.core.errors import (
    BranchBusy,
    ConfigurationError,
    HistoryHidden,
    HistoryTampered,
    PayloadConflict,
    RevertBarrierHeld,
    RunConflict,
    RunNotFound,
    StaleFence,
    TransitionRefused,
)
from oncewire.core.ids import this_process_owner
from oncewire.runs.chain import chain_name, event_hash, genesis_hash
from oncewire.runs.commands import ReviewCommands
from oncewire.runs.keys import key_id
from oncewire.runs.machine import (
    NEW,
    Refusal,
    Rows,
    Step,
    apply_command,
    fast_canonical,
    fast_digest,
    workflow,
)
from oncewire.runs.reads import RunReads
from oncewire.runs.records import Outcome, Projection, ReconcileReport, Run
from oncewire.runs.verify import Audit
from oncewire.runs.views import event_view as _event
from oncewire.runs.views import run_view
from oncewire.storage.base import Store
from oncewire.storage.runs import EventRow, RunAppend, RunRow

if TYPE_CHECKING:
    from oncewire.effects.ledger import Ledger
    from oncewire.runs.branches import Branches
    from oncewire.runs.deliveries import Deliveries

__all__ = ["DEFAULT_LEASE_SECONDS", "Outcome", "RunsView"]

DEFAULT_LEASE_SECONDS = 60.0

COMMAND_BEFORE_COMMIT = crash.register(
    "runs.command_before_commit", "a run command's event and row are written but not committed"
)
COMMAND_AFTER_COMMIT = crash.register(
    "runs.command_after_commit", "a run command is committed; the caller has not heard back"
)


_STATE_TAIL = '"state":"'


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


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 512:
        raise ConfigurationError("an idempotency key must be a non-empty string of at most 512")


class RunsView(ReviewCommands, RunReads):
    """The run ledger of a :class:`oncewire.Ledger`: ``ledger.runs``.

    ``key`` (bytes, held outside the database) makes the chain an HMAC-SHA256 chain; a ledger
    must be opened with the same key for every run it writes and verifies.
    """

    def __init__(self, ledger: Ledger, *, key: bytes | None = None) -> None:
        self._ledger = ledger
        self.key = key or None
        self.last_reconciliation: list[ReconcileReport] = []
        self._branches: Branches | None = None
        self._deliveries: Deliveries | None = None

    @property
    def store(self) -> Store:
        return self._ledger.store

    def now(self) -> float:
        return self._ledger.clock.now()

    # -- commands ----------------------------------------------------------------------------
    def start(
        self,
        run_id: str,
        *,
        key: str,
        scope: str,
        branch: str | None = None,
        turn: str | None = None,
        workflow_name: str = "review",
        params: dict[str, Any] | None = None,
        owner: str | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
    ) -> Outcome:
        """Start a run on ``branch`` (the scope's root branch by default), leased to ``owner``
        (this process by default, so that a peer on this host can tell when it died).

        Refused with :class:`BranchBusy` while another run is active on the branch, and with
        :class:`RevertBarrierHeld` while a revert holds the scope.
        """
        _check_key(key)
        if not isinstance(run_id, str) or not run_id:
            raise ConfigurationError("a run id must be a non-empty string")
        branch = branch or scope
        request: dict[str, Any] = {
            "workflow": workflow_name,
            "scope": scope,
            "branch": branch,
            "turn": turn,
            "params": params or {},
        }
        request_digest = digest({"command": "start", "request": request})
        owner = owner or this_process_owner()
        now = self.now()
        with self.store.transaction() as tx:
            existing = self.store.get_run_in_tx(tx, run_id)
            if existing is not None:
                return self._restart(tx, existing, key, request_digest)
            self._refuse_barrier(tx, scope, "start a run")
            try:
                flow = workflow(workflow_name)
            except Refusal as exc:
                raise ConfigurationError(exc.reason) from None
            self.branches.ensure_in_tx(tx, scope, branch, now)
            row = RunRow(
                run_id=run_id,
                scope=scope,
                branch=branch,
                turn=turn,
                workflow=flow.name,
                chain=chain_name(self.key),
                status="new",
                terminal_reason=None,
                state_json="{}",
                head_seq=0,
                head_hash=genesis_hash(run_id, self.key),
                owner=owner,
                fence=1,
                lease_expires_at=now + lease_seconds,
                created_at=now,
                updated_at=now,
                finished_at=None,
                abandoned_at=None,
                abandon_reason=None,
                hidden=False,
                key_id=key_id(self.key),
            )
            if not self.store.insert_run_in_tx(tx, row):
                existing = self.store.get_run_in_tx(tx, run_id)
                if existing is not None:  # a concurrent start of this run committed first
                    return self._restart(tx, existing, key, request_digest)
                busy = self.store.active_run_on_branch_in_tx(tx, scope, branch)
                if busy is None:
                    raise RunConflict(f"run {run_id!r} already exists", run_id=run_id)
                expired = busy.lease_expires_at is not None and busy.lease_expires_at < now
                raise BranchBusy(
                    f"branch {branch!r} has the active run {busy.run_id!r} "
                    f"({busy.status})"
                    + ("; its lease expired: it needs reconciliation" if expired else ""),
                    run_id=busy.run_id,
                    status=busy.status,
                    requires_reconciliation=expired,
                )
            stored, new_row, state = self._append_in_tx(
                tx,
                row,
                {"status": NEW},
                "start",
                request,
                key=key,
                request_digest=request_digest,
                owner=owner,
                fence=1,
                lease_expires_at=now + lease_seconds,
            )
            COMMAND_BEFORE_COMMIT.hit()
        COMMAND_AFTER_COMMIT.hit()
        return Outcome(run_view(new_row, state), _event(stored), False)

    def _restart(self, tx: Any, existing: RunRow, key: str, request_digest: str) -> Outcome:
        """A start of a run that exists: a replay under its start key, a conflict otherwise."""
        prior = self.store.event_by_key_in_tx(tx, existing.run_id, key)
        if prior is None or prior.seq != 1:
            self._refuse_released(existing)
            raise RunConflict(
                f"run {existing.run_id!r} was already started under another key",
                run_id=existing.run_id,
                key=key,
            )
        return self._replay(existing, prior, request_digest)

    def execute(
        self,
        run_id: str,
        command: str,
        request: dict[str, Any],
        *,
        key: str,
        owner: str | None = None,
        fence: int | None = None,
        lease_seconds: float | None = None,
        also_in_tx: Callable[[Any], None] | None = None,
    ) -> Outcome:
        """Apply ``command`` to the run (the generic form of every named command).

        ``also_in_tx(tx)`` runs inside the command's transaction after its event is written
        (and not on a replay), so that another ledger's write commits with it or not at all.
        """
        _check_key(key)
        if command == "start":
            raise ConfigurationError("use start() to start a run")
        request_digest = digest({"command": command, "request": request})
        now = self.now()
        with self.store.transaction() as tx:
            context = self.store.command_context_in_tx(tx, run_id, key)
            if context is None:
                raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
            row = context.run
            self._refuse_released(row)
            if context.prior is not None:
                return self._replay(row, context.prior, request_digest)
            state = self._verified_head(row, context.head)
            if command != "resolve_action" and context.barrier is not None:
                self._refuse_barrier(tx, row.scope, command)
            if fence is not None and fence != row.fence:
                raise StaleFence(
                    f"run {run_id!r} is held under fence {row.fence}, not {fence}",
                    run_id=run_id,
                    fence=row.fence,
                )
            if command == "terminate":
                # A terminal authorises a result: it is admitted only on a history that
                # verifies from its genesis.
                self._require_audit(row)
            lease_expires_at = row.lease_expires_at
            if lease_seconds is not None:
                lease_expires_at = now + lease_seconds
            stored, new_row, state = self._append_in_tx(
                tx,
                row,
                state,
                command,
                request,
                key=key,
                request_digest=request_digest,
                owner=owner if owner is not None else row.owner,
                fence=row.fence,
                lease_expires_at=lease_expires_at,
            )
            if also_in_tx is not None:
                also_in_tx(tx)
            COMMAND_BEFORE_COMMIT.hit()
        COMMAND_AFTER_COMMIT.hit()
        return Outcome(run_view(new_row, state), _event(stored), False)

    def accept_effect_in_tx(self, tx: Any, key: str, kind: str, payload: Any) -> None:
        """Accept an effect into the outbox inside a run command's transaction (the same key
        and payload again is a no-op; another payload raises :class:`PayloadConflict`)."""
        from oncewire.effects.ledger import DEFAULT_MAX_ATTEMPTS

        for name, value in (("effect key", key), ("effect kind", kind)):
            if not isinstance(value, str) or not value or len(value) > 512:
                raise ConfigurationError(f"an {name} must be a non-empty string")
        payload_json = canonical_json(payload)
        payload_digest = digest_json(payload_json)
        now = self.now()
        effect, created = self.store.insert_effect_in_tx(
            tx,
            key=key,
            kind=kind,
            payload_json=payload_json,
            digest=payload_digest,
            max_attempts=DEFAULT_MAX_ATTEMPTS,
            not_before=now,
            deadline=None,
            now=now,
        )
        if not created and (effect.digest != payload_digest or effect.kind != kind):
            raise PayloadConflict(key, effect.digest, payload_digest)

    def renew(self, run_id: str, *, owner: str, fence: int, lease_seconds: float) -> Run:
        """Extend the owner's lease; refused with :class:`StaleFence` once another took over."""
        now = self.now()
        with self.store.transaction() as tx:
            row = self.store.get_run_in_tx(tx, run_id)
            if row is None:
                raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
            if row.fence != fence or row.owner != owner or not row.active:
                raise StaleFence(
                    f"run {run_id!r} is no longer held by {owner!r} under fence {fence}",
                    run_id=run_id,
                )
            self.store.update_run_lease_in_tx(
                tx, run_id, owner=owner, fence=fence, lease_expires_at=now + lease_seconds, now=now
            )
        return self.get(run_id)

    def project(
        self, scope: str, branch: str | None = None, *, upto: int | None = None
    ) -> Projection:
        """What ``branch`` shows (at its head, or at cursor ``upto``): its latest run, folded
        from the events visible on it."""
        return self.branches.project(scope, branch or scope, upto=upto)

    def cursor(self, scope: str) -> int:
        with self.store.transaction() as tx:
            return self.store.scope_cursor_in_tx(tx, scope)

    @property
    def branches(self) -> Branches:
        if self._branches is None:
            from oncewire.runs.branches import Branches

            self._branches = Branches(self)
        return self._branches

    @property
    def deliveries(self) -> Deliveries:
        if self._deliveries is None:
            from oncewire.runs.deliveries import Deliveries

            self._deliveries = Deliveries(self)
        return self._deliveries

    def checkpoint(
        self, checkpoint_id: str, *, scope: str, branch: str | None = None, **kw: Any
    ) -> Any:
        return self.branches.checkpoint(checkpoint_id, scope=scope, branch=branch or scope, **kw)

    def fork(self, *, scope: str, checkpoint_id: str, branch: str) -> Any:
        return self.branches.fork(scope=scope, checkpoint_id=checkpoint_id, branch=branch)

    def revert(self, *, scope: str, branch: str | None = None, checkpoint_id: str) -> Any:
        return self.branches.revert(
            scope=scope, branch=branch or scope, checkpoint_id=checkpoint_id
        )

    def hold(
        self, *, scope: str, operation_id: str, state: str = "reverting", branch: str | None = None
    ) -> Any:
        return self.branches.hold(
            scope=scope, operation_id=operation_id, state=state, branch=branch
        )

    def release_hold(self, *, scope: str, operation_id: str) -> Any:
        return self.branches.hold(scope=scope, operation_id=operation_id, state="resolved")

    def reconcile(
        self, *, owner: str, limit: int = 100_000, dead_owners: Sequence[str] = ()
    ) -> builtins.list[ReconcileReport]:
        """Close what dead owners left: see :mod:`oncewire.runs.recovery`."""
        from oncewire.runs.recovery import reconcile

        self.last_reconciliation = reconcile(
            self, owner=owner, limit=limit, dead_owners=dead_owners
        )
        return self.last_reconciliation

    def adopt_key(self) -> builtins.list[str]:
        """Give a keyless store this ledger's key: see :func:`oncewire.runs.keys.adopt_key`."""
        from oncewire.runs.keys import adopt_key

        return adopt_key(self)

    def reports(self, *, limit: int = 100, subject_id: str | None = None) -> builtins.list[Any]:
        return self.store.list_reports(limit=limit, subject_id=subject_id)

    # -- internals ---------------------------------------------------------------------------
    def _require_audit(self, row: RunRow, *, snapshots: Sequence[int] = ()) -> Audit:
        result = self._audit(row, snapshots=snapshots)
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

    def _refuse_released(self, row: RunRow) -> None:
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

    def _refuse_barrier(self, tx: Any, scope: str, what: str) -> None:
        barrier = self.store.held_barrier_in_tx(tx, scope)
        if barrier is not None:
            raise RevertBarrierHeld(
                f"cannot {what}: revert {barrier.operation_id!r} holds scope {scope!r} "
                f"({barrier.state}) and requires recovery first",
                scope=scope,
                operation_id=barrier.operation_id,
                state=barrier.state,
            )

    def _verified_head(self, row: RunRow, head: EventRow | None) -> dict[str, Any]:
        """Incremental verification: the head event is intact and the row is its state."""

        def tampered(reason: str) -> HistoryTampered:
            return HistoryTampered(
                f"run {row.run_id!r} failed verification at event {row.head_seq}: {reason}; "
                "it authorises nothing",
                run_id=row.run_id,
                seq=row.head_seq,
                reason=reason,
            )

        chain = self._chain_key(row)  # a key that does not fit: ConfigurationError, no verdict
        if head is None or head.seq != row.head_seq or head.run_id != row.run_id:
            raise tampered("its head event is missing")
        computed = event_hash(
            chain, row.run_id, head.seq, head.type, head.prev_hash, head.payload_json
        )
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

    def _abandon_in_tx(self, tx: Any, row: RunRow, *, reason: str) -> None:
        """Release an active run without a terminal. Its history records the release (an
        ``abandon`` event) when its head verifies; a run whose head does not verify is released
        on its row alone, so that its evidence is never touched."""
        try:
            state: dict[str, Any] | None = self._verified_head(
                row, self.store.event_at_in_tx(tx, row.run_id, row.head_seq)
            )
        except HistoryTampered:
            state = None
        if state is not None:
            request = {"reason": reason}
            self._append_in_tx(
                tx,
                row,
                state,
                "abandon",
                request,
                key=f"abandon:{row.fence}:{row.head_seq}",
                request_digest=fast_digest({"command": "abandon", "request": request}),
                owner=row.owner,
                fence=row.fence,
                lease_expires_at=None,
            )
        self.store.abandon_run_in_tx(tx, row.run_id, reason=reason, now=self.now())

    def _replay(self, row: RunRow, prior: EventRow, request_digest: str) -> Outcome:
        if prior.request_digest != request_digest:
            raise RunConflict(
                f"key {prior.idempotency_key!r} of run {row.run_id!r} is bound to request "
                f"{prior.request_digest[:12]}…, not {request_digest[:12]}…; nothing was written",
                run_id=row.run_id,
                key=prior.idempotency_key,
                stored_digest=prior.request_digest,
                offered_digest=request_digest,
            )
        self._refuse_released(row)
        result = self._require_audit(row, snapshots=(prior.seq,))
        return Outcome(run_view(row, result.states[prior.seq]), _event(prior), True)

    def _refuse_used_ids(self, tx: Any, run_id: str, seq: int, rows: Rows) -> None:
        """A review, repair, finding or action id names one thing for the whole run: a command
        that would open one again (under another idempotency key) is refused here, before it
        writes, so the history and the rows that project it never disagree."""
        phases = [p.phase_id for p in rows.phases if p.status == "open" and p.opened_seq == seq]
        actions = [a.action_id for a in rows.actions if a.proposed_seq == seq]
        findings = [f.finding_id for f in rows.findings]
        if not (phases or actions or findings):
            return
        used = self.store.used_ids_in_tx(
            tx, run_id, phases=phases, findings=findings, actions=actions
        )
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

    def _append_in_tx(
        self,
        tx: Any,
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
        flow = workflow(row.workflow)
        now = self.now()
        seq = row.head_seq + 1
        try:
            transition, rows = apply_command(
                flow, state, command, request, Step(row.run_id, seq, now, owner)
            )
        except Refusal as exc:
            raise TransitionRefused(
                f"run {row.run_id!r}: {exc.reason}",
                run_id=row.run_id,
                command=command,
                status=row.status,
                reason=exc.reason,
            ) from None
        self._refuse_used_ids(tx, row.run_id, seq, rows)
        # The request passed the canonical check (digest) on its way in: encode it fast.
        state_json = fast_canonical(state)
        payload_json = fast_canonical(
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
        chain = self.key if row.chain == "hmac-sha256" else None
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
        stored = self.store.append_run_event_in_tx(
            tx, RunAppend(event, new_row, rows.phases, rows.findings, rows.actions)
        )
        return stored, new_row, state
