"""Named leases, written once (statements in ``storage/sql/leases.sql``).

The invariant: at any instant at most one owner holds a name under a given fence, and a name's
fence only grows. A change of holder is a compare and set on the fence, made under the row's
lock, so two processes racing for a name cannot both win; a holder that lost its lease learns
it from its fence (:class:`~oncewire.core.errors.StaleFence` on renewal), not from its clock.
Expiry is read against the caller's clock (``now``): hosts sharing a store keep their clocks
in step, as they do for every other lease oncewire keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oncewire.core.errors import ConfigurationError, StaleFence
from oncewire.core.ids import owner_is_dead_locally
from oncewire.storage.driver import Driver

__all__ = ["Lease", "LeaseVerbs"]


@dataclass(frozen=True, slots=True)
class Lease:
    """One named lease as stored: ``owner`` None once given back."""

    name: str
    owner: str | None
    fence: int
    expires_at: float
    updated_at: float

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Lease:
        name, owner, fence, expires_at, updated_at = row
        return cls(str(name), owner, int(fence), float(expires_at), float(updated_at))

    def live(self, now: float) -> bool:
        """Held by someone whose lease has not run out at ``now``."""
        return self.owner is not None and self.expires_at > now


def _check(name: str, owner: str, lease_seconds: float) -> None:
    if not isinstance(name, str) or not name:
        raise ConfigurationError("a lease needs a name")
    if not isinstance(owner, str) or not owner:
        raise ConfigurationError("a lease needs its owner's name")
    if not lease_seconds > 0:
        raise ConfigurationError("lease_seconds must be positive")


class LeaseVerbs:
    """The seam of named leases: acquire, renew, release and read them."""

    db: Driver

    def acquire_lease(
        self,
        name: str,
        *,
        owner: str,
        lease_seconds: float,
        now: float,
        dead_owners: Sequence[str] = (),
    ) -> Lease | None:
        """Take ``name`` for ``owner`` until ``now + lease_seconds``, or None while another
        holds it.

        Taken when nobody ever held it (fence 1), when it was given back or ran out (at or
        before ``now``), or when its holder is in ``dead_owners`` or is a process on this host
        that is certainly gone: then under the next fence. ``owner`` asking again for a lease it
        holds keeps its fence and extends it.
        """
        _check(name, owner, lease_seconds)
        db, q = self.db, self.db.queries
        expires_at = now + lease_seconds
        with db.write("acquiring a lease") as conn:
            if db.run(conn, q.insert_lease, name=name, owner=owner, expires_at=expires_at, now=now):
                return Lease(name, owner, 1, expires_at, now)
            row = db.one(conn, q.lease_for_update, name=name)
            assert row is not None  # the insert conflicted with it and rows are never deleted
            held = Lease.from_row(row)
            if held.owner == owner:
                db.run(
                    conn,
                    q.extend_lease,
                    name=name,
                    owner=owner,
                    fence=held.fence,
                    expires_at=expires_at,
                    now=now,
                )
                return Lease(name, owner, held.fence, expires_at, now)
            gone = held.owner is not None and (
                held.owner in dead_owners or owner_is_dead_locally(held.owner)
            )
            if held.live(now) and not gone:
                return None
            if not db.run(
                conn,
                q.take_lease,
                name=name,
                owner=owner,
                fence=held.fence,
                expires_at=expires_at,
                now=now,
            ):
                return None  # the fence moved under us (not while the row is locked)
            return Lease(name, owner, held.fence + 1, expires_at, now)

    def renew_lease(
        self, name: str, *, owner: str, fence: int, lease_seconds: float, now: float
    ) -> Lease:
        """Extend the lease ``owner`` holds under ``fence`` to ``now + lease_seconds``.

        :class:`StaleFence` once anyone else took it (the fence moved) or it was given back. A
        lease that ran out but that nobody took is still this owner's, under the same fence,
        and is extended: nobody else can have acted under it.
        """
        _check(name, owner, lease_seconds)
        db = self.db
        expires_at = now + lease_seconds
        with db.write("renewing a lease") as conn:
            renewed = db.run(
                conn,
                db.queries.extend_lease,
                name=name,
                owner=owner,
                fence=fence,
                expires_at=expires_at,
                now=now,
            )
        if not renewed:
            raise StaleFence(f"lease {name!r} is no longer held by {owner!r} under fence {fence}")
        return Lease(name, owner, fence, expires_at, now)

    def release_lease(self, name: str, *, owner: str, fence: int, now: float) -> bool:
        """Give the lease back (the next acquirer takes it at once, under the next fence);
        False when ``owner`` no longer held it under ``fence``."""
        db = self.db
        with db.write("releasing a lease") as conn:
            return bool(
                db.run(conn, db.queries.release_lease, name=name, owner=owner, fence=fence, now=now)
            )

    def get_lease(self, name: str) -> Lease | None:
        rows = self.db.read(self.db.queries.get_lease, name=name)
        return Lease.from_row(rows[0]) if rows else None
