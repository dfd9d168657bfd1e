"""Seed 002's re-delivery cells (GATEWAY.md §1.4): R1 ``during_turn``, R2 ``after_turn``, R3
``after_reconnect``, on ``fk_tg``, ``fk_ne`` and ``fk_dc``, through the module's real
``oncewire gateway run`` on SQLite and on PostgreSQL.

The platform delivers the same message id again: on ``fk_ne`` the webhook platform's own retry
of the message (``/control/redeliver``), on ``fk_tg`` a new update carrying the same message,
on ``fk_dc`` (R1, R2) Discord's own re-delivery: a Reconnect (op 7), and the Resume replays the
session's dispatches from that message's on (the fake's ``rewind_to``). On ``fk_dc`` R3 goes
through what a fresh process does instead of resuming: it identifies afresh and backfills each
active channel over REST after its last admitted message, which is the cell's own, so the
backfill reads nothing again (the cell checks that the fresh process made that call); the
re-delivery into the fresh process is then the message dispatched again to its new session.
R1 re-delivers while the message's turn streams, R2 after it is answered and delivered, R3 into
a fresh process (the gateway SIGKILLed and started again on the same store), so no in-memory
dedup could have helped. Every cell first sees the re-delivery reach the gateway (the inbound
row counts two deliveries, read from the store), then checks that the message was processed
once and answered once (I1-I6, ``exact``).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.seed002 import audits
from tests.gateway.seed002.checks import assert_exactly_once, user_rows
from tests.gateway.seed002.harness import DC, NE, PLATFORMS, TG, Seed002, answer

SLOW = {"chunk_chars": 6, "delay_per_chunk": 0.03}  # ~1.5 s of stream: time to re-deliver in
WHEN = ("during_turn", "after_turn", "after_reconnect")
R3 = "after_reconnect"
CELL_IDS = {"during_turn": "R1", "after_turn": "R2", "after_reconnect": "R3"}
# On PostgreSQL the default run keeps each cell on one platform (every platform in turn); the
# other PostgreSQL cells run in the soak run. SQLite keeps every cell on every platform.
ON_POSTGRESQL = {"during_turn": TG, "after_turn": NE, "after_reconnect": DC}


def soak_only(test: str, params: dict[str, Any]) -> bool:
    """A cell on PostgreSQL off :data:`ON_POSTGRESQL` runs in the soak run only (the seed002
    conftest marks it ``slow``)."""
    if test != "test_redelivered_inbound_id_processed_once" or params.get("rig") != "postgresql":
        return False
    return bool(ON_POSTGRESQL[params["when"]] != params["platform"])


def redeliver(
    rig: Seed002, platform: str, chat: str, text: str, message_id: str, when: str
) -> None:
    """The platform delivers ``message_id`` again, the same message as the first time."""
    if platform in (NE, DC):
        rig.redeliver(platform, chat, message_id, how="dispatch" if when == R3 else "replay")
    else:
        rig.inject(platform, chat, text, message_id=message_id)


def deliveries(rig: Seed002, platform: str, chat: str, token: str) -> int:
    rows = user_rows(rig, platform, chat, token)
    return int(rows[0]["deliveries"]) if len(rows) == 1 else 0


def backfills(rig: Seed002, chat: str, message_id: str) -> int:
    """How many backfills of ``chat`` after ``message_id`` the fake Discord answered."""
    return len(
        [
            c
            for c in rig.discord_calls()
            if c["method"] == "GET"
            and c["path"].endswith(f"/channels/{chat}/messages")
            and f"after={message_id}" in c["query"]
            and c["status"] == 200
        ]
    )


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
        redeliver(rig, platform, chat, text, message_id, when)
    rig.wait_idle([(platform, chat)], f"{token}: the turn")
    if when == R3:
        before = backfills(rig, chat, message_id)
        rig.restart()  # a fresh process: nothing of the first adapter survives
        if platform == DC:
            rig.wait_until(
                lambda: backfills(rig, chat, message_id) > before,
                f"{token}: the fresh process's backfill of the channel",
            )
    if when != "during_turn":
        redeliver(rig, platform, chat, text, message_id, when)
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
