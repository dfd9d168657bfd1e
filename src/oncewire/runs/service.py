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
from collections.abc import Callable, Sequence
from typing import Any

from oncewire.core.canonical import digest
from oncewire.core.clock import Clock
from oncewire.core.errors import (
    BranchBusy,
    ConfigurationError,
    RunConflict,
    RunNotFound,
    StaleFence,
)
from oncewire.core.ids import this_process_owner
from oncewire.core.limits import MAX_KEY_CHARS, check_name
from oncewire.effects.outbox import Effects
from oncewire.runs import append
from oncewire.runs.append import RunContext
from oncewire.runs.branches import Barrier, Branch, Branches, Checkpoint, Revert
from oncewire.runs.chain import chain_name, genesis_hash
from oncewire.runs.deliveries import Deliveries
from oncewire.runs.keys import adopt_key, key_id
from oncewire.runs.machine import NEW, Refusal, workflow
from oncewire.runs.reads import RunReads
from oncewire.runs.records import CommandResult, Projection, ReconcileReport, Run
from oncewire.runs.recovery import reconcile
from oncewire.runs.review import ReviewCommands
from oncewire.runs.turn import TurnCommands
from oncewire.runs.views import event_view as _event
from oncewire.runs.views import run_view
from oncewire.storage import RunStore, Transaction
from oncewire.storage.runs import ReportRow, RunRow
from oncewire.storage.twins import own_transaction

__all__ = ["DEFAULT_LEASE_SECONDS", "CommandResult", "Runs"]

DEFAULT_LEASE_SECONDS = 60.0


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 512:
        raise ConfigurationError("an idempotency key must be a non-empty string of at most 512")


def _report(row: ReportRow) -> ReconcileReport:
    return ReconcileReport(
        row.subject,
        row.subject_id,
        row.run_id,
        row.outcome,
        row.status,
        row.reason,
        row.error,
        pass_id=row.pass_id,
        owner=row.owner,
        created_at=row.created_at,
    )


class Runs(RunReads):
    """The run ledger: ``ledger.runs``.

    ``key`` (bytes, held outside the database) makes the chain an HMAC-SHA256 chain; a ledger
    must be opened with the same key for every run it writes and verifies. ``effects`` is the
    outbox that an action's ``dispatch`` accepts through. The review preset's named commands
    are ``runs.review``, the turn preset's ``runs.turn``; branches and deliveries are
    ``runs.branches`` and ``runs.deliveries``.
    """

    def __init__(
        self, store: RunStore, clock: Clock, *, key: bytes | None = None, effects: Effects
    ) -> None:
        self.context = RunContext(store, clock, key or None, effects)
        self.key = key or None
        self.last_reconciliation: list[ReconcileReport] = []
        self.branches = Branches(self.context)
        self.deliveries = Deliveries(self.context)
        self.review = ReviewCommands(self)
        self.turn = TurnCommands(self)

    @property
    def store(self) -> RunStore:
        return self.context.store

    def now(self) -> float:
        return self.context.clock.now()

    # -- commands ----------------------------------------------------------------------------
    def _command(self, write: Callable[[Transaction], CommandResult]) -> CommandResult:
        """The ``_in_tx`` command ``write`` in a transaction of its own (crash points on either
        side of its commit)."""
        return append.command_in_own_tx(self.store, write)

    def start_in_tx(
        self,
        tx: Transaction,
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
    ) -> CommandResult:
        """:meth:`start` inside the caller's transaction: the run exists when it commits, and
        not at all when it rolls back."""
        _check_key(key)
        run_id = check_name("a run id", run_id, MAX_KEY_CHARS)
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
        existing = self.store.get_run_in_tx(tx, run_id)
        if existing is not None:
            return self._restart(tx, existing, key, request_digest)
        append.refuse_barrier(self.context, tx, scope, "start a run")
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
            # A turn a dead process left is taken over by its session's next turn (resume), not
            # by boot reconciliation, which defers turns.
            then = "a takeover resumes it" if busy.workflow == "turn" else "it needs reconciliation"
            raise BranchBusy(
                f"branch {branch!r} has the active run {busy.run_id!r} "
                f"({busy.status})" + (f"; its lease expired: {then}" if expired else ""),
                run_id=busy.run_id,
                status=busy.status,
                requires_reconciliation=expired,
            )
        stored, new_row, state = append.append_in_tx(
            self.context,
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
        return CommandResult(run_view(new_row, state), _event(stored), False)

    start = own_transaction(
        start_in_tx,
        _command,
        """Start a run on ``branch`` (the scope's root branch by default), leased to ``owner``
        (this process by default, so that a peer on this host can tell when it died).

        Raises :class:`BranchBusy` while another run is active on the branch, and
        :class:`RevertBarrierHeld` while a revert holds the scope.
        """,
    )

    def _restart(
        self, tx: Transaction, existing: RunRow, key: str, request_digest: str
    ) -> CommandResult:
        """A start of a run that exists: a replay under its start key, a conflict otherwise."""
        prior = self.store.event_by_key_in_tx(tx, existing.run_id, key)
        if prior is None or prior.seq != 1:
            append.refuse_released(existing)
            raise RunConflict(
                f"run {existing.run_id!r} was already started under another key",
                run_id=existing.run_id,
                key=key,
            )
        return append.replay(self.context, existing, prior, request_digest)

    def execute_in_tx(
        self,
        tx: Transaction,
        run_id: str,
        command: str,
        request: dict[str, Any],
        *,
        key: str,
        owner: str | None = None,
        fence: int | None = None,
        lease_seconds: float | None = None,
        also_in_tx: Callable[[Transaction], None] | None = None,
    ) -> CommandResult:
        """:meth:`execute` inside the caller's transaction: the event is durable when the
        caller commits, and gone (with the caller's other writes) when it rolls back."""
        _check_key(key)
        if command == "start":
            raise ConfigurationError("use start() to start a run")
        request_digest = digest({"command": command, "request": request})
        now = self.now()
        context = self.store.command_context_in_tx(tx, run_id, key)
        if context is None:
            raise RunNotFound(f"no run {run_id!r}", run_id=run_id)
        row = context.run
        append.refuse_released(row)
        if context.prior is not None:
            return append.replay(self.context, row, context.prior, request_digest)
        state = append.verified_head(self.context, row, context.head)
        if command != "resolve_action" and context.barrier is not None:
            append.refuse_barrier(self.context, tx, row.scope, command)
        if fence is not None and fence != row.fence:
            raise StaleFence(
                f"run {run_id!r} is held under fence {row.fence}, not {fence}",
                run_id=run_id,
                fence=row.fence,
            )
        if command == "terminate":
            # A terminal authorises a result: it is admitted only on a history that
            # verifies from its genesis.
            append.require_audit(self.context, row)
        lease_expires_at = row.lease_expires_at
        if lease_seconds is not None:
            lease_expires_at = now + lease_seconds
        stored, new_row, state = append.append_in_tx(
            self.context,
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
        return CommandResult(run_view(new_row, state), _event(stored), False)

    execute = own_transaction(
        execute_in_tx,
        _command,
        """Apply ``command`` to the run (the generic form of every named command).

        ``also_in_tx(tx)`` runs inside the command's transaction after its event is written
        (and not on a replay), so that another ledger's write commits with it or not at all.
        """,
    )

    def accept_effect_in_tx(
        self,
        tx: Transaction,
        key: str,
        kind: str,
        payload: Any,
        *,
        max_attempts: int | None = None,
        deadline_seconds: float | None = None,
    ) -> None:
        """Accept an effect into the outbox inside a run command's transaction, through the
        outbox's one accept path (the same key and payload again is a no-op; another payload
        raises :class:`PayloadConflict`)."""
        append.accept_effect_in_tx(
            self.context,
            tx,
            key,
            kind,
            payload,
            max_attempts=max_attempts,
            deadline_seconds=deadline_seconds,
        )

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

    def checkpoint(
        self, checkpoint_id: str, *, scope: str, branch: str | None = None, **kw: Any
    ) -> Checkpoint:
        return self.branches.checkpoint(checkpoint_id, scope=scope, branch=branch or scope, **kw)

    def fork(self, *, scope: str, checkpoint_id: str, branch: str) -> Branch:
        return self.branches.fork(scope=scope, checkpoint_id=checkpoint_id, branch=branch)

    def revert(self, *, scope: str, branch: str | None = None, checkpoint_id: str) -> Revert:
        return self.branches.revert(
            scope=scope, branch=branch or scope, checkpoint_id=checkpoint_id
        )

    def hold(
        self, *, scope: str, operation_id: str, state: str = "reverting", branch: str | None = None
    ) -> Barrier:
        return self.branches.hold(
            scope=scope, operation_id=operation_id, state=state, branch=branch
        )

    def release_hold(self, *, scope: str, operation_id: str) -> Barrier:
        return self.branches.hold(scope=scope, operation_id=operation_id, state="resolved")

    def reconcile(
        self, *, owner: str, limit: int = 100_000, dead_owners: Sequence[str] = ()
    ) -> builtins.list[ReconcileReport]:
        """Close what dead owners left: see :mod:`oncewire.runs.recovery`."""
        self.last_reconciliation = reconcile(
            self.context, owner=owner, limit=limit, dead_owners=dead_owners
        )
        return self.last_reconciliation

    def adopt_key(self) -> builtins.list[str]:
        """Give a keyless store this ledger's key: see :func:`oncewire.runs.keys.adopt_key`."""
        return adopt_key(self.store, self.key, now=self.now())

    def reports(
        self, *, limit: int = 100, subject_id: str | None = None
    ) -> builtins.list[ReconcileReport]:
        """What reconciliation did to each run and delivery, newest first (as stored)."""
        return [_report(r) for r in self.store.list_reports(limit=limit, subject_id=subject_id)]
