"""The reply engine on the PostgreSQL backend: the same record, the same recovery."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire import Ledger
from oncewire.lab.suites.replies_rig import footer, header, reply_text
from oncewire.replies import TELEGRAM_LIKE, ReplyEngine, ReplyState
from oncewire.storage.postgres import PostgresStore
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import ChatView, FakePlatform, Fault
from tests.support.pg import migrated_schema, server_url


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    with migrated_schema(server_url(), "replies") as url:
        opened = Ledger(PostgresStore(url), clock=ManualClock())
        try:
            with opened.transaction() as tx:
                tx.execute("CREATE TABLE transcript (inbound_id BIGINT PRIMARY KEY, text TEXT)")
            yield opened
        finally:
            opened.close()


def _persist(inbound_id: int):  # type: ignore[no-untyped-def]
    def write(tx, text: str) -> None:  # type: ignore[no-untyped-def]
        tx.execute(
            "INSERT INTO transcript (inbound_id, text) VALUES (:id, :text)",
            {"id": inbound_id, "text": text},
        )

    return write


def test_streamed_and_ack_lost_replies(ledger: Ledger, tmp_path: Path) -> None:
    journal = tmp_path / "tg.jsonl"
    fake = FakePlatform(
        journal, TELEGRAM_LIKE, name="tg", faults=[Fault("ack_lost", contains=footer("A-2"))]
    )
    engine = ReplyEngine(ledger, {"tg": fake}, edit_interval_seconds=0.0)
    try:
        first = ledger.inbound.admit("tg", "bot", "c1", "in-1", {"text": "one"})
        assert not ledger.inbound.admit("tg", "bot", "c1", "in-1", {"text": "one"}).new
        text = reply_text("A-1", "streamed on postgres " * 300)
        pieces = [text[i : i + 400] for i in range(0, len(text), 400)]
        assert (
            engine.stream(first.inbound.id, pieces, on_commit=_persist(first.inbound.id)).status
            == "delivered"
        )
        second = ledger.inbound.admit("tg", "bot", "c2", "in-2", {"text": "two"})
        result = engine.answer(
            second.inbound.id, reply_text("A-2", "short."), on_commit=_persist(second.inbound.id)
        )
        assert result.status == "delivered" and result.reply.marked
    finally:
        fake.close()
    view = ChatView([journal])
    copies, others = view.copies("tg", "c1", header("A-1"), footer("A-1"), TELEGRAM_LIKE)
    assert len(copies) == 1 and copies[0].complete and not copies[0].marked and not others
    assert copies[0].text == text
    marks = [TELEGRAM_LIKE.strip_marker(m.text)[1] for m in view.visible("tg", "c2")]
    assert marks == [False, True]
    assert ledger.replies.counts()[ReplyState.DELIVERED] == 2


def test_two_engines_racing_for_one_reply_deliver_it_once(ledger: Ledger, tmp_path: Path) -> None:
    journal = tmp_path / "tg.jsonl"
    fake = FakePlatform(journal, TELEGRAM_LIKE, name="tg")
    admission = ledger.inbound.admit("tg", "bot", "race", "in-1", {"text": "race"})
    reply = ledger.replies.commit(
        admission.inbound.id, reply_text("A-race", "once."), TELEGRAM_LIKE
    )
    engines = [ReplyEngine(ledger, {"tg": fake}, owner=f"engine-{n}") for n in range(4)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(engines))

    def run(engine: ReplyEngine) -> None:
        barrier.wait()
        outcomes.append(engine.deliver(reply.id).status)

    threads = [threading.Thread(target=run, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    fake.close()
    assert "delivered" in outcomes and set(outcomes) <= {"delivered", "busy"}
    shown = ChatView([journal]).visible("tg", "race")
    assert len(shown) == 1 and not TELEGRAM_LIKE.strip_marker(shown[0].text)[1]
