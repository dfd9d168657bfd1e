"""Store contract: a session's history (``session_history``, migration 0011).

The messages before a given id on a session (platform, bot, chat, thread), those whose status
is asked for, the latest ``limit`` of them oldest first, each with the answer its user was given:
the reply's final text while it is committed or delivered, nothing for a withdrawn reply or one
whose delivery was given up. Other chats, other threads and later messages are not part of it.
"""

from __future__ import annotations

from oncewire.storage import Store
from oncewire.storage.replies import Exchange, InboundState

from .conftest import T0, RawDatabase
from .test_store_replies import _commit

SHOWN = (InboundState.ANSWERED, InboundState.DELIVERED, InboundState.SUPERSEDED)


def _admit(store: Store, message_id: str, *, chat: str = "chat1", thread: str = "") -> int:
    inbound, new = store.admit_inbound(
        platform="tg",
        bot="bot1",
        chat=chat,
        thread=thread,
        platform_message_id=message_id,
        payload_json=f'{{"text":"{message_id}"}}',
        digest=message_id,
        now=T0,
    )
    assert new
    return inbound.id


def _before(
    store: Store, inbound_id: int, statuses: object = None, limit: int = 10
) -> list[Exchange]:
    """The history before ``inbound_id`` on the session of tg/bot1/chat1."""
    return store.session_history(
        platform="tg",
        bot="bot1",
        chat="chat1",
        thread="",
        before_id=inbound_id,
        statuses=SHOWN if statuses is None else statuses,  # type: ignore[arg-type]
        limit=limit,
    )


def _seen(exchanges: list[Exchange]) -> list[tuple[str, str, str | None]]:
    return [(e.inbound.platform_message_id, str(e.inbound.status), e.answer) for e in exchanges]


def _session(store: Store) -> dict[str, int]:
    """m1 answered, m2 superseded by m3, m3 answered, m4 quarantined, m5
    the message asking; other chats and threads interleaved, m6 after it."""
    ids = {"m1": _admit(store, "m1")}
    _admit(store, "other-chat", chat="chat2")
    ids["m2"] = _admit(store, "m2")
    _admit(store, "other-thread", thread="t1")
    ids["m3"] = _admit(store, "m3")
    ids["m4"] = _admit(store, "m4")
    ids["m5"] = _admit(store, "m5")
    ids["m6"] = _admit(store, "m6")
    _commit(store, ids["m1"], "answer one")
    with store.transaction() as tx:
        store.start_inbound_in_tx(tx, ids["m2"], now=T0)
        store.link_inbound_in_tx(
            tx, ids["m2"], status=InboundState.SUPERSEDED, answered_by=ids["m3"], now=T0
        )
    _commit(store, ids["m3"], "answer three")
    store.quarantine_inbound(ids["m4"], reason="crashed three times", now=T0)
    _commit(store, ids["m6"], "answer six")
    return ids


def test_the_history_is_the_sessions_earlier_messages_with_their_answers(store: Store) -> None:
    ids = _session(store)
    history = _before(store, ids["m5"])
    assert _seen(history) == [
        ("m1", "answered", "answer one"),
        ("m2", "superseded", None),
        ("m3", "answered", "answer three"),
    ]
    assert [e.inbound.id for e in history] == [ids["m1"], ids["m2"], ids["m3"]]


def test_the_history_keeps_the_latest_messages_and_asked_statuses(store: Store) -> None:
    ids = _session(store)
    latest = _before(store, ids["m5"], limit=2)
    assert _seen(latest) == [("m2", "superseded", None), ("m3", "answered", "answer three")]
    quarantined = _before(store, ids["m6"], [InboundState.QUARANTINED])
    assert _seen(quarantined) == [("m4", "quarantined", None)]
    assert _before(store, ids["m1"]) == []
    other = store.session_history(
        platform="tg", bot="bot1", chat="chat2", thread="", before_id=10**6, statuses=SHOWN, limit=5
    )
    assert other == []  # its one message is still waiting


def test_an_answer_the_user_was_not_given_is_not_in_the_history(
    store: Store, raw: RawDatabase
) -> None:
    ids = _session(store)
    # m1's delivery was given up: the user may never have seen its text.
    raw.execute("UPDATE oncewire_replies SET state = 'dead' WHERE inbound_id = ?", (ids["m1"],))
    raw.execute(
        "UPDATE oncewire_replies SET state = 'delivered' WHERE inbound_id = ?", (ids["m3"],)
    )
    history = _before(store, ids["m5"])
    assert _seen(history) == [
        ("m1", "answered", None),
        ("m2", "superseded", None),
        ("m3", "answered", "answer three"),
    ]
