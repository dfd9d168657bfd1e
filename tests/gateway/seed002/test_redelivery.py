"""Seed 002's re-delivery cells (GATEWAY.md §1.4): R1 ``during_turn``, R2 ``after_turn``, R3
``after_reconnect``, on ``fk_tg`` and ``fk_ne``, through the module's real ``oncewire gateway
run`` on SQLite and on PostgreSQL.

The platform delivers the same message id again: on ``fk_ne`` the webhook platform's own retry
of the message (``/control/redeliver``), on ``fk_tg`` a new update carrying the same message.
R1 re-delivers while the message's turn streams, R2 after it is answered and delivered, R3 into
a fresh process (the gateway SIGKILLed and started again on the same store), so no in-memory
dedup could have helped. Every cell first sees the re-delivery reach the gateway (the inbound
row counts two deliveries, read from the store), then checks that the message was processed
once and answered once (I1-I6, ``exact``).
"""

from __future__ import annotations

import pytest

from tests.gateway.seed002 import audits
from tests.gateway.seed002.checks import assert_exactly_once, user_rows
from tests.gateway.seed002.harness import NE, PLATFORMS, Seed002, answer

SLOW = {"chunk_chars": 6, "delay_per_chunk": 0.03}  # ~1.5 s of stream: time to re-deliver in
WHEN = ("during_turn", "after_turn", "after_reconnect")
CELL_IDS = {"during_turn": "R1", "after_turn": "R2", "after_reconnect": "R3"}


def redeliver(rig: Seed002, platform: str, chat: str, text: str, message_id: str) -> None:
    """The platform delivers ``message_id`` again, the same message as the first time."""
    if platform == NE:
        rig.redeliver(NE, chat, message_id)
    else:
        rig.inject(platform, chat, text, message_id=message_id)


def deliveries(rig: Seed002, platform: str, chat: str, token: str) -> int:
    rows = user_rows(rig, platform, chat, token)
    return int(rows[0]["deliveries"]) if len(rows) == 1 else 0


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("when", WHEN, ids=[f"{CELL_IDS[w]}-{w}" for w in WHEN])
def test_redelivered_inbound_id_processed_once(rig: Seed002, platform: str, when: str) -> None:
    token = f"{platform}.redeliver-{when}"
    chat = rig.chat(platform, f"r-{platform}-{when}")
    aid = f"A-{token}"
    rig.script(token, answer(aid, "answer once " * 6, **SLOW))
    text = f"[in:{token}] hello"
    message_id = rig.inject(platform, chat, text)
    if when == "during_turn":
        rig.wait_until(
            lambda: rig.model_turns().turns.get(token) == 1, f"{token}: the turn to start"
        )
        redeliver(rig, platform, chat, text, message_id)
    rig.wait_idle([(platform, chat)], f"{token}: the turn")
    if when == "after_reconnect":
        rig.restart()  # a fresh process: nothing of the first adapter survives
    if when != "during_turn":
        redeliver(rig, platform, chat, text, message_id)
    rig.wait_until(
        lambda: deliveries(rig, platform, chat, token) == 2,
        f"{token}: the re-delivery to reach the gateway\n{rig.dump([(platform, chat)])}",
    )
    rig.wait_idle([(platform, chat)], f"{token} after the re-delivery")
    assert_exactly_once(rig, platform, chat, token, aid, "exact")
    (row,) = user_rows(rig, platform, chat, token)
    assert row["status"] == "delivered" and row["attempts"] == 1, row


# A1 and A2 run last on this module's gateway.
test_zz_whole_run_audit = audits.test_zz_whole_run_audit
test_zzz_unclean_restart_reruns_nothing = audits.test_zzz_unclean_restart_reruns_nothing
