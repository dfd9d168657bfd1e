"""Seed 002's busy cells (GATEWAY.md §1.4): B1 a ``/queue`` follow-up behind a slow turn, B2 a
plain follow-up that interrupts it (the default busy mode), on ``fk_tg``, ``fk_ne`` and
``fk_dc``, and B3 two Discord threads of one channel answered side by side, through the
module's real ``oncewire gateway run`` on SQLite and on PostgreSQL, judged by I1-I6.

``tests/gateway/test_busy.py`` proves the busy modes' mechanics on Telegram (the interrupt's
rows, the deleted preview, ``/stop``, queue mode); these cells are the seed's acceptance view of
the same behaviour on both platforms: on ``fk_ne`` nothing is previewed, so the interrupted
turn must leave nothing at all, and the queued reply must still follow the first one.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.seed002 import audits
from tests.gateway.seed002.checks import assert_exactly_once, copies_of, user_rows
from tests.gateway.seed002.harness import DC, PLATFORMS, STREAMING, TG, Seed002, answer, header

VERY_SLOW = {"chunk_chars": 6, "delay_per_chunk": 0.08}
# On PostgreSQL the default run keeps B1 on Discord and B2 on Telegram (and B3, Discord only);
# the other PostgreSQL cells run in the soak run. SQLite keeps every cell on every platform.
ON_POSTGRESQL = {
    "test_b1_slow_turn_with_queued_followup": DC,
    "test_b2_slow_turn_interrupted_by_followup": TG,
}


def soak_only(test: str, params: dict[str, Any]) -> bool:
    """A cell on PostgreSQL off :data:`ON_POSTGRESQL` runs in the soak run only (the seed002
    conftest marks it ``slow``)."""
    if test not in ON_POSTGRESQL or params.get("rig") != "postgresql":
        return False
    return bool(ON_POSTGRESQL[test] != params["platform"])


def order(rig: Seed002, platform: str, chat: str, aid: str) -> int:
    """Where the first message of ``aid``'s reply stands in the chat (-1: not shown)."""
    for n, message in enumerate(rig.view().visible(platform, chat)):
        if header(aid) in message.text:
            return n
    return -1


@pytest.mark.parametrize("platform", PLATFORMS)
def test_b1_slow_turn_with_queued_followup(rig: Seed002, platform: str) -> None:
    """B1: a follow-up sent with ``/queue`` while the first turn streams: both messages get
    exactly one complete reply, in arrival order, and neither turn runs twice."""
    t1, t2 = f"{platform}.q1", f"{platform}.q2"
    chat = rig.chat(platform, f"q-{platform}")
    rig.script(t1, answer(f"A-{t1}", "first, slowly " * 10, **VERY_SLOW))
    rig.script(t2, answer(f"A-{t2}", "second answer."))
    rig.inject(platform, chat, f"[in:{t1}] first")
    rig.wait_until(lambda: rig.model_turns().turns.get(t1) == 1, f"{t1}: the model turn")
    rig.inject(platform, chat, f"/queue [in:{t2}] second")
    rig.wait_idle([(platform, chat)], "both turns to drain")
    for token in (t1, t2):
        assert_exactly_once(rig, platform, chat, token, f"A-{token}", "exact")
    assert 0 <= order(rig, platform, chat, f"A-{t1}") < order(rig, platform, chat, f"A-{t2}"), (
        rig.dump([(platform, chat)])
    )


@pytest.mark.parametrize("platform", PLATFORMS)
def test_b2_slow_turn_interrupted_by_followup(rig: Seed002, platform: str) -> None:
    """B2: a plain follow-up interrupts the running turn (the default busy mode). The follow-up
    gets exactly one complete reply; the interrupted turn leaves no second or stale partial
    copy behind, is not run again, and nothing is persisted twice."""
    t1, t2 = f"{platform}.i1", f"{platform}.i2"
    chat = rig.chat(platform, f"i-{platform}")
    rig.script(t1, answer(f"A-{t1}", "long interrupted answer " * 30, **VERY_SLOW))
    rig.script(t2, answer(f"A-{t2}", "the follow-up answer."))
    rig.inject(platform, chat, f"[in:{t1}] first")
    rig.wait_until(lambda: rig.model_turns().turns.get(t1) == 1, f"{t1}: the model turn")
    if STREAMING[platform]:
        rig.wait_until(lambda: bool(rig.view().visible(platform, chat)), f"{t1}: the first preview")
    rig.inject(platform, chat, f"[in:{t2}] actually, do this instead")
    rig.wait_idle([(platform, chat)], "the interrupt and the follow-up to drain")
    ctx = rig.dump([(platform, chat)])
    assert_exactly_once(rig, platform, chat, t2, f"A-{t2}", "exact")
    assert rig.model_turns().turns.get(t1) == 1, ctx
    assert rig.model_turns().resumes.get(t1, 0) == 0, ctx
    (first,) = user_rows(rig, platform, chat, t1)
    (second,) = user_rows(rig, platform, chat, t2)
    assert len([c for c in copies_of(rig, platform, chat, f"A-{t1}") if c.complete]) <= 1, ctx
    # The first message was overtaken before its answer was committed (its stream takes ~10 s):
    # superseded by the second, its turn interrupted, nothing of it left on screen.
    assert (first["status"], first["answered_by"]) == ("superseded", second["id"]), ctx
    runs = {r["run_id"]: r for r in rig.run_rows()}
    assert runs[f"turn:{first['id']}"]["status"] == "interrupted", ctx
    assert copies_of(rig, platform, chat, f"A-{t1}") == [], ctx
    assert len(rig.view().visible(platform, chat)) == 1, ctx


def test_parallel_threads_are_independent(rig: Seed002) -> None:
    """B3: a slow turn in each of two Discord threads of one channel. Each thread is a session
    of its own, so neither waits for (or interrupts) the other: the two turns overlap in time
    (their runs, read from the store: each started before the other finished), and each reply
    lands exactly once, in its own thread (the fake's journal names the thread of every
    message)."""
    chat = rig.chat(DC, "par-dc")
    threads = {f"{DC}.thr{n}": rig.thread(chat, f"thr{n}") for n in (0, 1)}
    for token in threads:
        rig.script(token, answer(f"A-{token}", f"answer in {token} " * 8, **VERY_SLOW))
    for token, thread in threads.items():
        rig.inject(DC, chat, f"[in:{token}] question in a thread", thread=thread)
    rig.wait_idle([(DC, chat)], "both threads' turns")
    ctx = rig.dump([(DC, chat)])
    for token, thread in threads.items():
        shown = assert_exactly_once(rig, DC, chat, token, f"A-{token}", "exact")
        where = {m.message_id: m.thread for m in rig.view().visible(DC, chat)}
        assert {where[i] for i in shown.message_ids} == {thread}, ctx
        (row,) = user_rows(rig, DC, chat, token)
        assert row["status"] == "delivered", ctx
    assert {m.thread for m in rig.view().visible(DC, chat)} == set(threads.values()), ctx
    rows = {r["id"]: r for r in rig.inbound_rows(DC, chat)}
    assert len(rows) == 2, ctx
    runs = rig.rows(
        "SELECT run_id, status, created_at, finished_at FROM oncewire_runs ORDER BY run_id"
    )
    turns = [r for r in runs if r["run_id"] in {f"turn:{i}" for i in rows}]
    assert [r["status"] for r in turns] == ["answered", "answered"], turns
    first, second = turns
    # Overlapping: each turn started before the other one finished (a turn streams ~1 s).
    assert first["created_at"] < second["finished_at"], turns
    assert second["created_at"] < first["finished_at"], turns


# A1 and A2 run last on this module's gateway.
test_zz_whole_run_audit = audits.test_zz_whole_run_audit
test_zzz_unclean_restart_reruns_nothing = audits.test_zzz_unclean_restart_reruns_nothing
