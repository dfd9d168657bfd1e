"""The outbox's verbs, written once (statements in ``storage/sql/effects.sql``).

Accept, read, claim and settle effects, renew and release leases, and the operator's cancel and
retry, with the attempt history written in the transaction that closes each attempt. What
differs per dialect is in the SQL (``postgresql.sql``: the SKIP LOCKED claim, the FILTER
backlog) or in the driver (how many settlement rows one statement carries).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import EffectNotFound
from oncewire.storage.driver import Driver, Pending, Pipeline, Transaction
from oncewire.storage.records import (
    AttemptRecord,
    Backlog,
    Claim,
    Effect,
    EffectState,
    Settlement,
    attempt_error,
    attempt_outcome,
    cancelled_attempt,
)

__all__ = ["MAX_RECOVERIES", "DispatchStep", "EffectVerbs"]

# How many times an owner may die while an effect's sink runs before the effect is dead: much
# higher than attempts, because a crash is usually not the effect's fault (DBOS bounds its
# recoveries the same way).
MAX_RECOVERIES = 20


@dataclass(frozen=True, slots=True)
class DispatchStep:
    """What :meth:`EffectVerbs.dispatch_step` did."""

    applied: list[bool]  # per settlement: it applied (its claim was still held)
    started: set[int]  # ids of the ``starting`` claims recorded as starting
    claims: list[Claim]  # the new claims, the ones recorded as starting first


_CANCELLED_ATTEMPT = (
    "effect_id",
    "attempt",
    "fence",
    "owner",
    "redelivery",
    "error",
    "finished_at",
)


def _insert_row(
    key: str,
    kind: str,
    payload_json: str,
    digest: str,
    max_attempts: int,
    not_before: float,
    deadline: float | None,
    now: float,
    traceparent: str | None,
) -> dict[str, Any]:
    """insert_effect's values."""
    return {
        "key": key,
        "kind": kind,
        "payload": payload_json,
        "digest": digest,
        "max_attempts": max_attempts,
        "not_before": not_before,
        "deadline": deadline,
        "now": now,
        "traceparent": traceparent,
    }


def _inserted(id: int, row: dict[str, Any]) -> Effect:
    """The record of the effect just inserted with ``row``: every other column is its default,
    so it is built rather than read back."""
    return Effect(
        id=id,
        key=row["key"],
        kind=row["kind"],
        payload_json=row["payload"],
        digest=row["digest"],
        state=EffectState.PENDING,
        attempts=0,
        max_attempts=row["max_attempts"],
        not_before=row["not_before"],
        deadline=row["deadline"],
        fence=0,
        lease_owner=None,
        lease_expires_at=None,
        maybe_sent=False,
        result_json=None,
        last_error=None,
        created_at=row["now"],
        updated_at=row["now"],
    )


def _scope(kinds: Sequence[str] | None, keys: Sequence[str] | None) -> dict[str, Any]:
    """The kinds and keys filters' values (None: any)."""
    return {
        "any_kind": kinds is None,
        "kinds": () if kinds is None else kinds,
        "any_key": keys is None,
        "keys": () if keys is None else keys,
    }


def _attempt_rows(items: Sequence[Settlement], now: float) -> list[tuple[Any, ...]]:
    """record_attempts' rows: one attempt-history row per settlement."""
    return [
        (
            i.id,
            i.fence,
            i.attempt,
            i.redelivery,
            attempt_outcome(i),
            str(i.state),
            attempt_error(i),
            i.started_at,
            now if i.finished_at is None else i.finished_at,
        )
        for i in items
    ]


def _settle_rows(items: Sequence[Settlement]) -> list[tuple[Any, ...]]:
    """settle's rows: what each settlement writes on its effect."""
    return [
        (
            i.id,
            i.fence,
            str(i.state),
            i.result_json,
            i.last_error,
            i.not_before,
            i.maybe_sent,
            int(i.refund_attempt),
        )
        for i in items
    ]


class EffectVerbs:
    """The outbox's seam: its verbs, written once over ``self.db``; each docstring is the contract
    the effects ledger and the dispatcher rely on."""

    db: Driver

    def insert_effect_in_tx(
        self,
        tx: Transaction,
        *,
        key: str,
        kind: str,
        payload_json: str,
        digest: str,
        max_attempts: int,
        not_before: float,
        deadline: float | None,
        now: float,
        traceparent: str | None = None,
    ) -> tuple[Effect, bool]:
        """Insert the effect unless its key exists; return the row and whether it is new.
        ``traceparent`` (the accepting span's W3C trace context) is stored with a new effect
        and handed back with each of its claims.

        Does not compare digests: the ledger does, and raises before the transaction commits."""
        row = _insert_row(
            key, kind, payload_json, digest, max_attempts, not_before, deadline, now, traceparent
        )
        return self._insert_in(self.db.tx_conn(tx), row)

    def _insert_in(self, conn: Any, row: dict[str, Any]) -> tuple[Effect, bool]:
        db, q = self.db, self.db.queries
        with db.translate_errors("accepting an effect"):
            inserted = db.one(conn, q.insert_effect, **row)
            if inserted is not None:
                return _inserted(inserted[0], row), True
            found = db.one(conn, q.get_effect, key=row["key"])
        assert found is not None  # the insert conflicted with it, in this transaction
        return Effect.from_row(found), False

    def insert_effect_alone(
        self,
        *,
        key: str,
        kind: str,
        payload_json: str,
        digest: str,
        max_attempts: int,
        not_before: float,
        deadline: float | None,
        now: float,
        traceparent: str | None = None,
        before_commit: Callable[[], None] = lambda: None,
    ) -> tuple[Effect, bool]:
        """:meth:`insert_effect_in_tx` in a transaction of its own, committed before it returns
        (PostgreSQL: one statement, one round trip). ``before_commit()`` is called where nothing
        is durable yet. An existing key is read back after the commit: the insert changed
        nothing then, whatever the digests say. With commits grouped, a transaction shared
        with this process's other writers (:mod:`oncewire.storage.grouping`)."""
        row = _insert_row(
            key, kind, payload_json, digest, max_attempts, not_before, deadline, now, traceparent
        )
        if self.db.commits_grouped:
            with self.db.transaction() as tx:
                found = self._insert_in(self.db.tx_conn(tx), row)
                before_commit()
            return found
        inserted = self.db.one_alone(
            "accepting an effect", self.db.queries.insert_effect, before_commit=before_commit, **row
        )
        if inserted is not None:
            return _inserted(inserted[0], row), True
        existing = self.get_effect(key)
        if existing is None:  # only an operator's delete in between could do this
            raise EffectNotFound(f"effect {key!r} vanished while it was being accepted", key=key)
        return existing, False

    def get_effect(self, key: str) -> Effect | None:
        rows = self.db.read(self.db.queries.get_effect, key=key)
        return Effect.from_row(rows[0]) if rows else None

    def list_effects(
        self,
        *,
        states: Sequence[EffectState] = (),
        kind: str | None = None,
        limit: int = 100,
        after_id: int = 0,
        newest_first: bool = False,
        before_id: int | None = None,
    ) -> list[Effect]:
        """Effects by id, oldest first (``newest_first``: the other way); ``after_id`` and
        ``before_id`` bound the ids (exclusive), so either direction pages by the last id seen."""
        q = self.db.queries
        rows = self.db.read(
            q.list_effects_newest if newest_first else q.list_effects,
            after_id=after_id,
            before_id=before_id,
            any_state=not states,
            states=[str(s) for s in states],
            kind=kind,
            limit=limit,
        )
        return [Effect.from_row(row) for row in rows]

    def count_effects(self, *, kind: str | None = None) -> dict[EffectState, int]:
        """How many effects are in each state (of ``kind`` only, when given)."""
        counts = dict.fromkeys(EffectState, 0)
        for state, count in self.db.read(self.db.queries.count_effects, kind=kind):
            counts[EffectState(state)] = int(count)
        return counts

    # -- claiming and settling ---------------------------------------------------------------
    def dispatch_step(
        self,
        settlements: Sequence[Settlement],
        *,
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        kinds: Sequence[str] | None = None,
        starting: Sequence[tuple[int, int]] = (),
        mark: int = 0,
        suspects: bool = True,
        keys: Sequence[str] | None = None,
    ) -> DispatchStep:
        """A dispatcher's one transaction: apply ``settlements``, record the sinks of the
        claims ``starting`` (id, fence) as about to be called, then claim up to ``limit``.

        A claim's sink may be called only once it is recorded as starting (:attr:`Claim.
        started`, or its id in :attr:`DispatchStep.started`), because a release counts an
        attempt, and flags the next one a redelivery, only for a claim so recorded. The first
        ``mark`` claims of a batch are recorded as starting in the claim itself. A due effect
        an owner died on while its sink ran is claimed alone (and recorded as starting), so a
        poison effect that kills its process takes no other effect down with it: with
        ``suspects``, such an effect is looked for first and, if one is due, claimed alone;
        without, none is claimed (a batch never takes one).

        ``starting`` is fenced like a settlement: a claim released or cancelled meanwhile is
        left out of :attr:`DispatchStep.started`, and its sink must not be called.

        Each settlement applies only if its effect is still claimed under its fence
        (:attr:`DispatchStep.applied` says which did). Claiming bumps the fence and the attempt
        count and leases the effect to ``owner`` until ``now + lease_seconds``; past-deadline
        effects are not claimed. ``kinds`` limits the claim, suspects included, to effects this
        worker has sinks for (None: any kind); ``keys`` to the effects with those keys (None:
        any key), for a worker that may perform only some of a kind's effects (the MCP proxy:
        the calls its own client waits for). A claimed payload stored around oncewire that is
        not UTF-8 is returned as undecodable text where the driver cannot read it otherwise
        (:meth:`Driver.tolerant`)."""
        scope = _scope(kinds, keys)
        return self.db.tolerant(
            lambda: self._dispatch_step(
                settlements, owner, now, lease_seconds, limit, scope, starting, mark, suspects
            )
        )

    def _dispatch_step(
        self,
        settlements: Sequence[Settlement],
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        filters: dict[str, Any],
        starting: Sequence[tuple[int, int]],
        mark: int,
        suspects: bool,
    ) -> DispatchStep:
        if not suspects:
            return self._dispatch_step_sent_together(
                settlements, owner, now, lease_seconds, limit, filters, starting, mark
            )
        db, q = self.db, self.db.queries
        expires = now + lease_seconds
        started: set[int] = set()
        rows: list[Any] = []
        with db.write("settling and claiming effects") as conn:
            applied = self._settle_in_tx(conn, settlements, now) if settlements else []
            if any(applied):
                db.announce_settled(conn)  # whoever waits for a result reads it at our commit
            for begin in range(0, len(starting), db.values_chunk):
                chunk = starting[begin : begin + db.values_chunk]
                marked = db.all(conn, q.mark_started, fences=chunk, owner=owner)
                started.update(row[0] for row in marked)
            if limit > 0:
                scope = {"owner": owner, "expires_at": expires, "now": now, **filters}
                rows = db.all(conn, q.claim_suspect, **scope) if suspects else []
                if not rows:
                    marked_now = min(max(mark, 0), limit)
                    if marked_now:
                        rows = db.all(conn, q.claim, mark=True, limit=marked_now, **scope)
                    if limit > len(rows):
                        rows += db.all(conn, q.claim, mark=False, limit=limit - len(rows), **scope)
        claims = [Claim.from_row(row, expires) for row in rows]
        claims.sort(key=lambda claim: (not claim.started, claim.id))
        return DispatchStep(applied, started, claims)

    def _dispatch_step_sent_together(
        self,
        settlements: Sequence[Settlement],
        owner: str,
        now: float,
        lease_seconds: float,
        limit: int,
        filters: dict[str, Any],
        starting: Sequence[tuple[int, int]],
        mark: int,
    ) -> DispatchStep:
        """The step when no suspect is looked for: no statement depends on another's rows, so
        they are sent together (:meth:`Driver.pipelined_write`; on PostgreSQL the whole
        transaction is one round trip). Where :meth:`_dispatch_step` announces settlements
        only if one applied, this announces them whenever there are some: a waiter woken for
        nothing reads the store and waits again."""
        db, q = self.db, self.db.queries
        expires = now + lease_seconds
        chunk = db.values_chunk
        settled: list[Pending] = []
        marked: list[Pending] = []
        claimed: list[Pending] = []

        def fill(statements: Pipeline) -> None:
            for begin in range(0, len(settlements), chunk):
                items = settlements[begin : begin + chunk]
                statements.run(q.record_attempts, rows=_attempt_rows(items, now))
                settled.append(statements.rows(q.settle, rows=_settle_rows(items), now=now))
            if settlements:
                db.announce_settled_in(statements)
            for begin in range(0, len(starting), chunk):
                fences = starting[begin : begin + chunk]
                marked.append(statements.rows(q.mark_started, fences=fences, owner=owner))
            if limit > 0:
                scope = {"owner": owner, "expires_at": expires, "now": now, **filters}
                # If the first claim finds fewer than marked_now due effects, the second (the
                # same due effects) finds none: its limit need not wait for the first's rows.
                marked_now = min(max(mark, 0), limit)
                if marked_now:
                    claimed.append(statements.rows(q.claim, mark=True, limit=marked_now, **scope))
                if limit > marked_now:
                    claimed.append(
                        statements.rows(q.claim, mark=False, limit=limit - marked_now, **scope)
                    )

        # Sent again on a fresh connection if the server dropped this one. Settlements and
        # start markers are fenced: a first run that did commit makes them change nothing the
        # second time. Claims that first run made would be held until their lease runs out and
        # then released as if their sink had run, as after any commit whose answer was lost.
        db.pipelined_write("settling and claiming effects", fill)
        applied_pairs = {(row[0], row[1]) for pending in settled for row in pending.rows}
        applied = [(i.id, i.fence) in applied_pairs for i in settlements]
        started = {row[0] for pending in marked for row in pending.rows}
        claims = [Claim.from_row(row, expires) for pending in claimed for row in pending.rows]
        claims.sort(key=lambda claim: (not claim.started, claim.id))
        return DispatchStep(applied, started, claims)

    def _settle_in_tx(self, conn: Any, items: Sequence[Settlement], now: float) -> list[bool]:
        """Write the attempt history of each settlement that will apply (read from its claim
        before the settlement clears the owner), then apply them; which did."""
        db, q = self.db, self.db.queries
        applied: set[tuple[int, int]] = set()
        for chunk in self._chunks(items):
            db.run(conn, q.record_attempts, rows=_attempt_rows(chunk, now))
            rows = db.all(conn, q.settle, rows=_settle_rows(chunk), now=now)
            applied.update((row[0], row[1]) for row in rows)
        return [(i.id, i.fence) in applied for i in items]

    def _chunks(self, items: Sequence[Settlement]) -> Iterator[Sequence[Settlement]]:
        size = self.db.values_chunk
        for start in range(0, len(items), size):
            yield items[start : start + size]

    def renew_leases(
        self, owner: str, fences: Sequence[tuple[int, int]], expires_at: float, now: float
    ) -> int:
        """Extend the leases ``(id, fence)`` still held by ``owner``; return how many were."""
        if not fences:
            return 0
        db, q = self.db, self.db.queries
        renewed = 0
        with db.write("renewing leases") as conn:
            for start in range(0, len(fences), db.values_chunk):
                chunk = fences[start : start + db.values_chunk]
                renewed += len(
                    db.all(
                        conn,
                        q.renew_leases,
                        fences=chunk,
                        expires_at=expires_at,
                        now=now,
                        owner=owner,
                    )
                )
        return renewed

    def lease_holders(self) -> list[str]:
        """The distinct owners of claimed effects."""
        return [row[0] for row in self.db.read(self.db.queries.lease_holders)]

    def release_claims(
        self,
        *,
        now: float,
        dead_owners: Sequence[str] = (),
        max_recoveries: int = MAX_RECOVERIES,
    ) -> int:
        """Release claims whose lease expired or whose owner is known dead.

        A claim whose sink was recorded as starting may have reached its receiver: it becomes
        ``uncertain`` (its next attempt is a redelivery) and counts one recovery, not an
        attempt; at ``max_recoveries`` recoveries, or with its deadline passed, it is ``dead``.
        A claim whose sink was never called gives its attempt back and goes back as it was
        (``pending``, or ``uncertain`` if an earlier attempt may have landed)."""
        db, q = self.db, self.db.queries
        scope = {"now": now, "dead_owners": dead_owners, "max_recoveries": max_recoveries}
        with db.write("releasing claims") as conn:
            # The attempt history first, while each claim still names its owner.
            db.run(conn, q.record_released, **scope)
            return db.run(conn, q.release_claims, **scope)

    def expire_deadlines(self, now: float) -> int:
        """Move waiting effects whose deadline passed to ``dead``."""
        db = self.db
        with db.write("expiring deadlines") as conn:
            return db.run(conn, db.queries.expire_deadlines, now=now)

    def backlog(
        self, kinds: Sequence[str] | None = None, keys: Sequence[str] | None = None
    ) -> Backlog:
        """What remains for a dispatcher of ``kinds`` (None: any kind) that claims only the
        effects with ``keys`` (None: any key)."""
        row = self.db.read(self.db.queries.backlog, **_scope(kinds, keys))[0]
        return Backlog(
            next_due=row[0], uncertain=row[1], claimed=row[2], retrying=row[3], next_retry=row[4]
        )

    def waiting_kinds(self) -> dict[str, tuple[int, float]]:
        """Every kind with effects waiting for an attempt: kind -> (how many are pending or
        uncertain, the oldest one's ``created_at``). A kind with none waiting is absent."""
        rows = self.db.read(self.db.queries.waiting_kinds)
        return {kind: (int(count), float(oldest)) for kind, count, oldest in rows}

    def list_attempts(self, effect_id: int) -> list[AttemptRecord]:
        """The effect's attempt history, oldest first (by fence): one row per attempt closed."""
        rows = self.db.read(self.db.queries.list_attempts, effect_id=effect_id)
        return [AttemptRecord.from_row(row) for row in rows]

    def recent_attempts(self, *, since: float, limit: int = 10_000) -> list[AttemptRecord]:
        """Every effect's attempts closed at or after ``since``, oldest first, at most
        ``limit`` of them: what the attempt history says happened lately, for a chart."""
        rows = self.db.read(self.db.queries.recent_attempts, since=since, limit=limit)
        return [AttemptRecord.from_row(row) for row in rows]

    # -- the operator's commands -------------------------------------------------------------
    def _locked_effect(self, conn: Any, key: str) -> Effect:
        row = self.db.one(conn, self.db.queries.lock_effect, key=key)
        if row is None:
            raise EffectNotFound(f"no effect with key {key!r}", key=key)
        return Effect.from_row(row)

    def cancel_effect(self, key: str, *, now: float, reason: str) -> Effect:
        """Any non-terminal effect -> ``cancelled``; a claimed one loses its lease."""
        db, q = self.db, self.db.queries
        with db.write("cancelling an effect") as conn:
            effect = self._locked_effect(conn, key)
            effect.check_cancellable()
            # Only a claim whose sink was recorded as starting may be in flight: the cancel
            # bumps the fence, so one not yet started never will be.
            in_flight = effect.state is EffectState.CLAIMED and effect.started_fence == effect.fence
            if in_flight:
                reason += f" (while attempt {effect.attempts} was in flight: it may have landed)"
                row = cancelled_attempt(effect, reason, now)
                db.run(conn, q.record_cancelled, **dict(zip(_CANCELLED_ATTEMPT, row, strict=True)))
            # An attempt in flight may land: a later retry must go out flagged as a redelivery.
            updated = db.one(
                conn,
                q.cancel_effect,
                reason=reason,
                now=now,
                maybe_sent=in_flight or effect.maybe_sent,
                id=effect.id,
            )
        assert updated is not None  # locked above
        return Effect.from_row(updated)

    def retry_effect(self, key: str, *, now: float) -> Effect:
        """A ``dead``, ``rejected`` or ``cancelled`` effect -> ``pending`` with fresh attempts."""
        db = self.db
        with db.write("retrying an effect") as conn:
            effect = self._locked_effect(conn, key)
            effect.check_retryable()
            updated = db.one(conn, db.queries.retry_effect, now=now, id=effect.id)
        assert updated is not None  # locked above
        return Effect.from_row(updated)
