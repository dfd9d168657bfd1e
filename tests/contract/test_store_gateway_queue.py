"""Store contract: what a gateway waits for, read without its history (migration 0013).

``queued_inbound``: each session's oldest ``received`` message, of the platforms asked, oldest
first, at most ``limit``; a session whose first message is being answered still offers its
next one (the scheduler knows which sessions it runs), and a session's later messages wait
behind its first. ``newest_inbound_ids``: per channel, the newest numeric message id admitted
lately. ``deliverable_replies`` and ``next_reply_due``: the committed replies whose time has
come and that nobody holds, and when the next one will be. ``subscribe_inbound`` and
``subscribe_replies`` wake their subscribers at the commits that matter to them (and
``announce_inbound_in_tx`` at one the inbox does not show), never once stopped.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

from oncewire.storage import Store
from oncewire.storage.replies import InboundState, ReplyOpening, ReplyState, SendRequest

from .conftest import T0, RawDatabase


def _admit(
    store: Store,
    message_id: str,
    *,
    platform: str = "tg",
    chat: str = "chat1",
    thread: str = "",
    now: float = T0,
) -> int:
    inbound, new = store.admit_inbound(
        platform=platform,
        bot="bot1",
        chat=chat,
        thread=thread,
        platform_message_id=message_id,
        payload_json='{"text":"hi"}',
        digest="d",
        now=now,
    )
    assert new
    return inbound.id


def _queued(store: Store, platforms: list[str] | None = None, limit: int = 10) -> list[int]:
    found = store.queued_inbound(platforms=platforms or ["tg"], limit=limit)
    assert all(inbound.status is InboundState.RECEIVED for inbound in found)
    return [inbound.id for inbound in found]


def _commit(store: Store, inbound_id: int, *, platform: str = "tg", now: float = T0) -> int:
    request = SendRequest(platform, "bot1", "chat1", "", reply_to=None, format="plain")
    with store.transaction() as tx:
        reply, changed = store.commit_reply_in_tx(
            tx,
            ReplyOpening(inbound_id, request, 4096, "utf16", 5),
            final_text="hello",
            plan_json='[{"body":"hello"}]',
            planned_sends=[(0, "hello")],
            now=now,
        )
    assert changed
    return reply.id


# -- the queue -------------------------------------------------------------------------------


def test_each_session_offers_its_oldest_waiting_message_oldest_first(store: Store) -> None:
    a1 = _admit(store, "a1")
    b1 = _admit(store, "b1", chat="chat2")
    _admit(store, "a2")  # behind a1
    t1 = _admit(store, "t1", thread="topic")  # a thread is a session of its own
    _admit(store, "b2", chat="chat2")
    _admit(store, "other", platform="dc")  # not a platform asked for
    assert _queued(store) == [a1, b1, t1]
    assert _queued(store, limit=2) == [a1, b1]
    assert len(_queued(store, ["tg", "dc"])) == 4
    assert _queued(store, ["nowhere"]) == []


def test_a_session_offers_its_next_message_once_its_first_is_no_longer_waiting(
    store: Store,
) -> None:
    a1, a2, a3 = (_admit(store, f"a{n}") for n in (1, 2, 3))
    store.start_inbound(a1, now=T0)  # answering: its turn runs (the scheduler knows where)
    assert _queued(store) == [a2]
    _commit(store, a1)
    store.quarantine_inbound(a2, reason="crashed", now=T0)
    assert _queued(store) == [a3]
    with store.transaction() as tx:
        store.link_inbound_in_tx(tx, a3, status=InboundState.MERGED, answered_by=a1, now=T0)
    assert _queued(store) == []


def test_handled_messages_are_not_part_of_the_queue(store: Store, raw: RawDatabase) -> None:
    for n in range(30):
        inbound_id = _admit(store, f"old{n}", chat=f"chat{n % 3}")
        _commit(store, inbound_id)
    raw.execute("UPDATE oncewire_inbound SET status = 'delivered'")
    fresh = _admit(store, "fresh", chat="chat1")
    assert _queued(store) == [fresh]


# -- where a backfill starts -----------------------------------------------------------------


def test_the_newest_numeric_id_per_channel_admitted_lately(store: Store) -> None:
    _admit(store, "900", chat="c1", now=T0 - 100)  # too old
    _admit(store, "99", chat="c1", now=T0)
    _admit(store, "100", chat="c1", now=T0 + 1)  # a number: 100 > 99, though "100" < "99"
    _admit(store, "0042", chat="c1", now=T0 + 2)  # leading zeros: 42
    _admit(store, "abc", chat="c1", now=T0 + 3)  # not a number: not a snowflake
    _admit(store, "7", chat="c1", thread="th", now=T0)  # a thread is its own channel
    _admit(store, "123456789012345678901234", chat="c2", now=T0)  # longer than 64 bits
    _admit(store, "55", chat="c3", platform="dc", now=T0)  # another platform
    newest = store.newest_inbound_ids(platform="tg", since=T0 - 10)
    assert newest == {"c1": "100", "th": "7", "c2": "123456789012345678901234"}
    assert store.newest_inbound_ids(platform="tg", since=T0 + 10) == {}
    assert store.newest_inbound_ids(platform="dc", since=T0 - 10) == {"c3": "55"}


# -- replies to deliver ----------------------------------------------------------------------


def test_deliverable_replies_are_committed_due_and_held_by_nobody(store: Store) -> None:
    due = _commit(store, _admit(store, "m1"))
    later = _commit(store, _admit(store, "m2"))
    store.release_reply(later, owner="nobody", now=T0)  # not its owner: changes nothing
    held = _commit(store, _admit(store, "m3"))
    elsewhere = _commit(store, _admit(store, "m4", platform="dc"), platform="dc")
    assert store.claim_reply(later, owner="w1", now=T0, lease_seconds=30) is not None
    store.release_reply(later, owner="w1", now=T0, not_before=T0 + 50)
    assert store.claim_reply(held, owner="w1", now=T0, lease_seconds=30) is not None
    delivered = _commit(store, _admit(store, "m5"))
    store.finish_reply(delivered, state=ReplyState.DELIVERED, now=T0)

    def deliverable(now: float, platforms: list[str] | None = None) -> list[int]:
        found = store.deliverable_replies(platforms=platforms or ["tg"], now=now, limit=10)
        return [reply.id for reply in found]

    assert deliverable(T0) == [due]
    assert deliverable(T0 + 31) == [due, held]  # its lease ran out
    assert deliverable(T0 + 50) == [due, held, later]  # soonest first
    assert deliverable(T0, ["dc"]) == [elsewhere]
    assert [r.id for r in store.deliverable_replies(platforms=["tg"], now=T0 + 50, limit=1)] == [
        due
    ]

    assert store.next_reply_due(platforms=["dc"]) == T0
    store.finish_reply(due, state=ReplyState.DELIVERED, now=T0)
    # held: deliverable once its lease ends (T0 + 30); later at its retry time (T0 + 50).
    assert store.next_reply_due(platforms=["tg"]) == T0 + 30
    store.release_reply(held, owner="w1", now=T0 + 1)
    assert store.next_reply_due(platforms=["tg"]) == T0
    store.finish_reply(held, state=ReplyState.DELIVERED, now=T0)
    assert store.next_reply_due(platforms=["tg"]) == T0 + 50
    assert store.next_reply_due(platforms=["nowhere"]) is None


# -- wake-ups --------------------------------------------------------------------------------


def _woken_by(
    subscribe: Callable[[Callable[[], None]], Callable[[], None]], write: Callable[[], object]
) -> bool:
    woken = threading.Event()
    stop = subscribe(woken.set)
    try:
        time.sleep(0.1)  # PostgreSQL: the listener's LISTEN is in place
        woken.clear()
        write()
        return woken.wait(timeout=20)
    finally:
        stop()


def test_an_inbox_subscription_is_woken_by_an_admission_and_a_turn_ending(
    store: Store,
) -> None:
    assert _woken_by(lambda wake: store.subscribe_inbound(wake), lambda: _admit(store, "m1")), (
        "an admission"
    )
    first = store.list_inbound()[0].id
    store.start_inbound(first, now=T0)
    assert _woken_by(lambda wake: store.subscribe_inbound(wake), lambda: _commit(store, first)), (
        "an answer"
    )


def test_an_announced_inbox_change_wakes_the_inbox_subscription(
    store: Store, raw: RawDatabase
) -> None:
    raw.execute("CREATE TABLE app_notes (n INTEGER)")

    def announce() -> None:
        # A write the inbox does not show (a turn's interrupt, in a gateway), announced.
        with store.transaction() as tx:
            tx.execute("INSERT INTO app_notes (n) VALUES (:n)", {"n": 1})
            store.announce_inbound_in_tx(tx)

    assert _woken_by(lambda wake: store.subscribe_inbound(wake), announce), (
        "an announcement woke nobody"
    )


def test_a_replies_subscription_is_woken_by_a_reply_given_back(store: Store) -> None:
    reply_id = _commit(store, _admit(store, "m1"))
    assert store.claim_reply(reply_id, owner="w1", now=T0, lease_seconds=30) is not None

    def give_back() -> None:
        store.release_reply(reply_id, owner="w1", now=T0, not_before=T0 + 5)

    assert _woken_by(lambda wake: store.subscribe_replies(wake), give_back), (
        "a reply given back woke nobody"
    )
    committed = _woken_by(
        lambda wake: store.subscribe_replies(wake), lambda: _commit(store, _admit(store, "m2"))
    )
    assert committed, "a reply committed with no lease woke nobody"


def test_a_stopped_inbox_subscription_is_never_woken(store: Store) -> None:
    woken = threading.Event()
    stop = store.subscribe_inbound(woken.set)
    time.sleep(0.1)
    stop()
    woken.clear()
    _admit(store, "after-stop")
    time.sleep(0.1)
    assert not woken.is_set()


def test_a_subscription_made_as_the_last_one_stops_is_still_woken(store: Store) -> None:
    """A subscriber that arrives while the watching thread is ending (its last subscriber just
    left) gets a thread that watches: it was left with none on SQLite."""
    for n in range(5):
        stop = store.subscribe_inbound(lambda: None)
        stop()
        admit = functools.partial(_admit, store, f"m{n}")
        woken = _woken_by(lambda wake: store.subscribe_inbound(wake), admit)
        assert woken, f"subscription {n} was never woken"
