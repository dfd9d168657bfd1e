"""``oncewire gateway run`` rides out a crash of the PostgreSQL server under its store.

The gateway (a real process, with the fake Bot API and the fake model as processes of their
own) serves five chats from a store on the private cluster (:mod:`tests.chaos.conftest`). While
model streams are in progress the cluster is stopped with ``pg_ctl stop -m immediate``; two more
messages arrive while it is down (their admission fails, so the poller does not confirm them to
Telegram), and the cluster is started again after a few seconds. The gateway must still be the
same process, and every message must be answered once: one visible bot message per chat,
carrying its answer, read from the fake's journal; each inbound message delivered once with its
answer, and the run ledger verifying, read from the store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.inbound import InboundState
from oncewire.replies import TELEGRAM_LIKE, ReplyState
from tests.chaos.conftest import PrivateCluster
from tests.conftest import wait_for
from tests.gateway.test_runner import Rig
from tests.support.pg import fresh_schema

CHATS = [str(20_001 + i) for i in range(5)]
BEFORE_CRASH = 3  # messages sent before the crash; the rest arrive while the store is down


def _answer(i: int) -> str:
    return f"Answer number {i}, streamed slowly in small pieces to the chat."


def _script() -> dict[str, Any]:
    """Each message's answer, whether asked afresh or for a resumed turn, as often as asked."""
    by_token: dict[str, list[dict[str, Any]]] = {}
    for i in range(len(CHATS)):
        slow = {"kind": "text", "text": _answer(i), "chunk_chars": 6, "delay_per_chunk": 0.15}
        by_token[f"tok{i}"] = [slow] * 6
    return {"by_token": by_token, "resume": by_token}


@pytest.fixture
def store(pg_cluster: PrivateCluster) -> Iterator[str]:
    if not pg_cluster.running():
        pg_cluster.start()
    with fresh_schema(pg_cluster.url, "chaos_gw") as url:
        yield url


@pytest.fixture
def rig(tmp_path: Path, store: str) -> Iterator[Rig]:
    made = Rig(tmp_path, _script(), store)
    try:
        yield made
    finally:
        made.stop()


def _delivered(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            with Ledger(url, create=False) as ledger:
                found = ledger.inbound.list(limit=100)
        except Exception:
            return False
        return len(found) == len(CHATS) and all(i.status is InboundState.DELIVERED for i in found)

    return check


def test_the_gateway_survives_a_postgres_crash_mid_turn(
    pg_cluster: PrivateCluster, rig: Rig, store: str
) -> None:
    gateway = rig.start(grace_seconds=10)
    for i in range(BEFORE_CRASH):
        rig.telegram.inject(chat=CHATS[i], text=f"question tok{i}")
    wait_for(lambda: len(rig.model.requests()) >= 2, timeout=30, what="two model streams")
    pg_cluster.crash()
    for i in range(BEFORE_CRASH, len(CHATS)):  # arrive while the store is down
        rig.telegram.inject(chat=CHATS[i], text=f"question tok{i}")
    time.sleep(3.0)
    assert gateway.process.poll() is None, gateway.log_text()[-3000:]
    pg_cluster.start()

    wait_for(_delivered(store), timeout=180, what="every message to be delivered")
    assert gateway.process.poll() is None, "the gateway exited"

    # What the users see: one bot message per chat, its answer.
    for i, chat in enumerate(CHATS):
        shown = [TELEGRAM_LIKE.strip_marker(m.text)[0] for m in rig.telegram.shown(chat)]
        assert shown == [_answer(i)], (chat, shown)

    # What the store says: each message admitted once, answered once and delivered.
    with Ledger(store, create=False) as ledger:
        inbound = sorted(ledger.inbound.list(limit=100), key=lambda i: int(i.chat))
        assert [i.chat for i in inbound] == CHATS
        for i, message in enumerate(inbound):
            assert message.status is InboundState.DELIVERED
            reply = ledger.replies.for_inbound(message.id)
            assert reply is not None
            assert (reply.state, reply.final_text) == (ReplyState.DELIVERED, _answer(i))
            run = ledger.runs.get(f"turn:{message.id}")
            assert run.status == "answered"
        assert all(v.ok for v in ledger.runs.verify())

    log = gateway.log_text()
    assert pg_cluster.recovered_from_crash(), pg_cluster.tail()
    # The outage was logged as one, and the turns it stopped were taken over again as soon as
    # the store answered: not swept up later as a gone owner's once their turn lease ran out.
    assert "the store is unavailable" in log and "the store answers again" in log, log[-3000:]
    assert "its owner is gone" not in log and "failed unexpectedly" not in log, log[-3000:]
    # Every loop, the platform's listener included, says the outage in lines, not tracebacks.
    assert "Traceback" not in log, log[max(0, log.find("Traceback") - 600) :][:3000]
    assert gateway.terminate() == 0, log[-3000:]
