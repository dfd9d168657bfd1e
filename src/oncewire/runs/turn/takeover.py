"""Taking a turn over: the next process leases a turn whose owner died, under the next fence,
and records it (``run_resumed``) in the same transaction.

The lease is not history, but a takeover is: the event carries the new owner and the fence it
moves to, and the turn's table admits it only as ``fence = from_fence + 1`` of the fence the
history last recorded, so the fences a turn was held under are read from its history.
"""

from __future__ import annotations

from collections.abc import Sequence

from oncewire.core.canonical import digest
from oncewire.core.errors import ConfigurationError, RunNotFound, StaleFence, TransitionRefused
from oncewire.core.ids import owner_is_dead_locally
from oncewire.runs import append
from oncewire.runs.append import RunContext
from oncewire.runs.records import CommandResult
from oncewire.runs.views import event_view, run_view
from oncewire.storage import Transaction

__all__ = ["take_over_in_tx"]


def take_over_in_tx(
    ctx: RunContext,
    tx: Transaction,
    name: str,
    *,
    owner: str,
    from_fence: int,
    lease_seconds: float,
    reason: str,
    dead_owners: Sequence[str] = (),
) -> CommandResult:
    """Lease run ``name`` to ``owner`` under ``from_fence + 1`` and append its ``resume``.

    Refused (:class:`TransitionRefused`, ``lease_held``) while the holder's lease is live,
    unless the holder is ``owner`` itself, is named in ``dead_owners`` or is a process on this
    host that is certainly gone; :class:`StaleFence` when the run is no longer held under
    ``from_fence``. The same takeover again is a replay; another owner's from the same fence a
    :class:`RunConflict` (its key, ``resume:{fence}``, is taken).
    """
    if not isinstance(owner, str) or not owner:
        raise ConfigurationError("a takeover needs the new owner's name")
    if not isinstance(from_fence, int) or isinstance(from_fence, bool) or from_fence < 1:
        raise ConfigurationError("from_fence is the fence the previous owner held (>= 1)")
    if not lease_seconds > 0:
        raise ConfigurationError("lease_seconds must be positive")
    request = {
        "owner": owner,
        "from_fence": from_fence,
        "fence": from_fence + 1,
        "reason": reason,
    }
    key = f"resume:{from_fence + 1}"
    request_digest = digest({"command": "resume", "request": request})
    now = ctx.now()
    context = ctx.store.command_context_in_tx(tx, name, key)
    if context is None:
        raise RunNotFound(f"no run {name!r}", run_id=name)
    row = context.run
    append.refuse_released(row)
    if context.prior is not None:
        return append.replay(ctx, row, context.prior, request_digest)
    state = append.verified_head(ctx, row, context.head)
    if context.barrier is not None:
        append.refuse_barrier(ctx, tx, row.scope, "resume")
    if row.fence != from_fence:
        raise StaleFence(
            f"run {name!r} is held under fence {row.fence}, not {from_fence}",
            run_id=name,
            fence=row.fence,
        )
    live = row.lease_expires_at is not None and row.lease_expires_at >= now
    holder = row.owner or ""
    held = live and holder != owner and holder not in dead_owners
    if held and not owner_is_dead_locally(holder):
        raise TransitionRefused(
            f"run {name!r}: its owner {holder!r} holds it (lease live); it is taken "
            "over only once the lease expired or the owner is known dead",
            run_id=name,
            command="resume",
            status=row.status,
            reason="lease_held",
        )
    stored, new_row, state = append.append_in_tx(
        ctx,
        tx,
        row,
        state,
        "resume",
        request,
        key=key,
        request_digest=request_digest,
        owner=owner,
        fence=from_fence + 1,
        lease_expires_at=now + lease_seconds,
    )
    return CommandResult(run_view(new_row, state), event_view(stored), False)
