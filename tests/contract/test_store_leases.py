"""Store contract: named leases (a gateway's bot leases), checked in the rows through a second
connection. At most one owner holds a name; a change of holder moves the fence up by one; a
holder whose fence moved is refused."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from oncewire.core.errors import StaleFence
from oncewire.storage import Store, open_store
from oncewire.storage.verbs.leases import Lease

from .conftest import T0, RawDatabase

NAME = "bot:tg:123"


def _row(raw: RawDatabase, name: str = NAME) -> tuple[object, ...]:
    rows = raw.query("SELECT owner, fence, expires_at FROM oncewire_leases WHERE name = ?", (name,))
    assert len(rows) == 1
    return rows[0]


def _race(
    store: Store, contenders: int, acquire: Callable[[Store, str], Lease | None]
) -> dict[str, Lease | None]:
    """``contenders`` threads, half on a second store over the same database, each asking for
    the lease at the same instant; what each got."""
    other = open_store(store.url)
    barrier = threading.Barrier(contenders)
    got: dict[str, Lease | None] = {}
    errors: list[BaseException] = []

    def contend(index: int) -> None:
        owner = f"owner-{index}"
        on = store if index % 2 else other
        try:
            barrier.wait(timeout=30)
            got[owner] = acquire(on, owner)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        other.close()
    assert not errors, errors
    assert len(got) == contenders
    return got


def test_owners_racing_for_a_new_lease_leave_one_holder_under_fence_1(
    store: Store, raw: RawDatabase
) -> None:
    got = _race(
        store, 8, lambda on, owner: on.acquire_lease(NAME, owner=owner, lease_seconds=30, now=T0)
    )
    winners = [owner for owner, lease in got.items() if lease is not None]
    assert len(winners) == 1
    assert _row(raw) == (winners[0], 1, T0 + 30)
    assert raw.count("oncewire_leases") == 1


def test_owners_racing_for_an_expired_lease_leave_one_holder_under_the_next_fence(
    store: Store, raw: RawDatabase
) -> None:
    first = store.acquire_lease(NAME, owner="old", lease_seconds=10, now=T0)
    assert first is not None and first.fence == 1
    later = T0 + 11
    got = _race(
        store,
        8,
        lambda on, owner: on.acquire_lease(NAME, owner=owner, lease_seconds=30, now=later),
    )
    winners = [owner for owner, lease in got.items() if lease is not None]
    assert len(winners) == 1
    assert _row(raw) == (winners[0], 2, later + 30)


def test_a_live_lease_is_refused_to_another_owner_and_extended_for_its_holder(
    store: Store, raw: RawDatabase
) -> None:
    held = store.acquire_lease(NAME, owner="a", lease_seconds=30, now=T0)
    assert held is not None
    assert store.acquire_lease(NAME, owner="b", lease_seconds=30, now=T0 + 29) is None
    assert _row(raw) == ("a", 1, T0 + 30)
    again = store.acquire_lease(NAME, owner="a", lease_seconds=30, now=T0 + 20)
    assert again is not None and again.fence == 1
    assert _row(raw) == ("a", 1, T0 + 50)
    read = store.get_lease(NAME)
    assert read is not None and (read.owner, read.fence, read.expires_at) == ("a", 1, T0 + 50)
    assert store.get_lease("bot:nobody") is None


def test_an_expired_lease_is_taken_under_a_higher_fence_and_the_old_holder_is_refused(
    store: Store, raw: RawDatabase
) -> None:
    old = store.acquire_lease(NAME, owner="a", lease_seconds=10, now=T0)
    assert old is not None
    # At its expiry instant exactly, the lease is free.
    new = store.acquire_lease(NAME, owner="b", lease_seconds=10, now=T0 + 10)
    assert new is not None and new.fence == old.fence + 1
    assert _row(raw) == ("b", 2, T0 + 20)
    with pytest.raises(StaleFence):
        store.renew_lease(NAME, owner="a", fence=old.fence, lease_seconds=10, now=T0 + 11)
    assert _row(raw) == ("b", 2, T0 + 20)  # the refused renewal wrote nothing
    renewed = store.renew_lease(NAME, owner="b", fence=2, lease_seconds=10, now=T0 + 15)
    assert renewed.fence == 2
    assert _row(raw) == ("b", 2, T0 + 25)


def test_a_renewal_with_a_stale_fence_is_refused_even_by_the_same_owner_name(
    store: Store, raw: RawDatabase
) -> None:
    store.acquire_lease(NAME, owner="a", lease_seconds=10, now=T0)
    assert store.release_lease(NAME, owner="a", fence=1, now=T0 + 1)
    back = store.acquire_lease(NAME, owner="a", lease_seconds=10, now=T0 + 2)
    assert back is not None and back.fence == 2
    with pytest.raises(StaleFence):
        store.renew_lease(NAME, owner="a", fence=1, lease_seconds=10, now=T0 + 3)
    assert _row(raw) == ("a", 2, T0 + 12)


def test_a_lapsed_lease_nobody_took_is_still_renewed_by_its_holder(
    store: Store, raw: RawDatabase
) -> None:
    store.acquire_lease(NAME, owner="a", lease_seconds=10, now=T0)
    renewed = store.renew_lease(NAME, owner="a", fence=1, lease_seconds=10, now=T0 + 60)
    assert renewed.expires_at == T0 + 70
    assert _row(raw) == ("a", 1, T0 + 70)


def test_a_released_lease_is_free_at_once_and_keeps_its_fence(
    store: Store, raw: RawDatabase
) -> None:
    store.acquire_lease(NAME, owner="a", lease_seconds=600, now=T0)
    assert not store.release_lease(NAME, owner="b", fence=1, now=T0 + 1)  # not b's to give
    assert _row(raw)[0] == "a"
    assert store.release_lease(NAME, owner="a", fence=1, now=T0 + 1)
    assert _row(raw) == (None, 1, T0 + 1)
    taken = store.acquire_lease(NAME, owner="b", lease_seconds=600, now=T0 + 1)
    assert taken is not None and taken.fence == 2
    lease = store.get_lease(NAME)
    assert lease is not None and (lease.name, lease.owner, lease.fence) == (NAME, "b", 2)


def test_a_lease_of_a_dead_local_process_is_taken_before_it_expires(
    store: Store, raw: RawDatabase
) -> None:
    from oncewire.core.ids import this_process_owner

    # A real process's owner name, taken from the process itself, then the process ends.
    child = subprocess.run(
        [sys.executable, "-c", "from oncewire.core.ids import this_process_owner as o; print(o())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = child.stdout.strip()
    assert store.acquire_lease(NAME, owner=dead, lease_seconds=600, now=T0) is not None
    # A live holder (this process) is not taken over, however it is named.
    alive = this_process_owner()
    assert store.acquire_lease("other", owner=alive, lease_seconds=600, now=T0) is not None
    assert store.acquire_lease("other", owner="b", lease_seconds=600, now=T0 + 1) is None
    taken = store.acquire_lease(NAME, owner="b", lease_seconds=600, now=T0 + 1)
    assert taken is not None and taken.fence == 2
    assert _row(raw) == ("b", 2, T0 + 601)
    # A holder named in dead_owners (on another host, say) is taken over too.
    third = store.acquire_lease(NAME, owner="c", lease_seconds=600, now=T0 + 2, dead_owners=["b"])
    assert third is not None and third.fence == 3
