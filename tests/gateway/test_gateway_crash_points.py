"""The gateway's own crash windows (``gateway.*``), each armed in a real ``gateway run`` process.

An armed point makes the gateway SIGKILL itself at that instant; the test then checks what the
store holds at the kill, restarts the gateway on the same store and checks, from the fake Bot
API's journal, the fake model's requests, the tools' execution log and the store, that the
message is answered once, that a done tool never runs again and that an interrupted turn is
never resumed. A point registered without a scenario here fails
``test_every_gateway_crash_point_has_a_scenario``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import pytest

from oncewire.core import crash
from oncewire.gateway import admission, turn
from oncewire.inbound import InboundState
from oncewire.storage.records import EffectState
from tests.conftest import wait_for
from tests.gateway.test_busy import FIRST_PARTIAL, SECOND, assert_interrupted
from tests.gateway.test_runner import (
    Gateway,
    Rig,
    assert_answered_once,
    bot_messages,
    rig,
    run_events,
)
from tests.gateway.test_tools import executions, tool_rig

__all__ = ["rig", "tool_rig"]  # the fixtures, imported for these tests

pytestmark = [pytest.mark.crash, pytest.mark.empty_store]  # the gateway creates its store

REGISTERING = (admission, turn)  # the modules that register the gateway.* crash points

ANSWER = "The answer, streamed in small pieces so that previews happen."
SUM = "The sum is 3."


def armed(point: str) -> dict[str, str]:
    return {crash.ENV_POINTS: point}


def died_at(gateway: Gateway) -> None:
    """The armed gateway killed itself (SIGKILL), not some other ending."""
    code = gateway.process.wait(timeout=60)
    assert code == -signal.SIGKILL, gateway.log_text()
    gateway.kill()  # reaps and closes; the process is already gone


def test_admitted_before_cursor(rig: Callable[..., Rig], store_url: str) -> None:
    """Admitted, killed before the offset moved past the update: Telegram serves it again, the
    admission finds it already there (one row), and it is answered once."""
    r = rig([{"kind": "text", "text": ANSWER, "chunk_chars": 8}], db=store_url)
    first = r.start(env=armed("gateway.admitted_before_cursor"))
    update_id = r.telegram.inject(text="hello")["update_id"]
    died_at(first)
    assert r.telegram.call("state")["pending_updates"] == [update_id]  # never confirmed
    with r.ledger() as ledger:
        (inbound,) = ledger.inbound.list(limit=10)
        assert (inbound.status, inbound.attempts) == (InboundState.RECEIVED, 0)

    gateway = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    wait_for(
        lambda: r.telegram.call("state")["pending_updates"] == [],
        what="the update to be confirmed",
    )
    assert bot_messages(r) == [(ANSWER, False)]
    assert_answered_once(r, 1, ANSWER)
    with r.ledger() as ledger:
        assert [i.id for i in ledger.inbound.list(limit=10)] == [1]  # one row, served twice
        assert ledger.inbound.get(1).attempts == 1
    assert len(r.model.requests()) == 1
    assert gateway.terminate() == 0


def test_turn_started_before_model(rig: Callable[..., Rig], store_url: str) -> None:
    r = rig([{"kind": "text", "text": ANSWER, "chunk_chars": 8}], db=store_url)
    died_at_start = r.start(env=armed("gateway.turn_started_before_model"))
    r.telegram.inject(text="hello")
    died_at(died_at_start)
    assert r.model.requests() == []  # killed before the model was asked
    with r.ledger() as ledger:
        inbound = ledger.inbound.get(1)
        assert (inbound.status, inbound.attempts) == (InboundState.ANSWERING, 1)
        assert ledger.runs.get("turn:1").status == "running"
        assert ledger.replies.for_inbound(1) is not None  # opened in T2, before any preview

    gateway = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [(ANSWER, False)]
    assert_answered_once(r, 1, ANSWER)
    assert len(r.model.requests()) == 1
    with r.ledger() as ledger:
        assert ledger.inbound.get(1).attempts == 2
        assert run_events(ledger, 1) == [
            "run_started",
            "run_resumed",
            "step_recorded",
            "run_terminated",
        ]
    assert gateway.terminate() == 0


def tool_script() -> list[dict[str, Any]]:
    return [
        {"kind": "tool_call", "name": "add", "args": {"a": 1, "b": 2}},
        {"kind": "text", "text": SUM},
    ]


def test_step_recorded_before_dispatch(tool_rig: Callable[..., Rig]) -> None:
    """Killed on the turn's thread right after T3 committed. The dispatcher's thread, woken by
    that commit, may have gone on before the kill landed (the turn's thread can lose the
    processor there): claimed the effect, even run the tool and recorded its outcome. The turn
    itself got no further. Whatever the dispatcher got to, the restart answers once without
    asking the model for the step again, and runs the tool again only where the first process
    had claimed it and not recorded an outcome, marked as a redelivery (it may have been sent)."""
    r = tool_rig(tool_script())
    first = r.start(env=armed("gateway.step_recorded_before_dispatch"))
    r.telegram.inject(text="add 1 and 2")
    died_at(first)
    ran = [e["redelivery"] for e in executions(r)]
    with r.ledger() as ledger:
        effect = ledger.effects.get("turn/1/s1/0")
        state = (effect.state, effect.attempts)
        assert run_events(ledger, 1) == ["run_started", "step_recorded", "action_proposed"]
    assert (state, ran) in (
        ((EffectState.PENDING, 0), []),  # the dispatcher had not claimed it
        ((EffectState.CLAIMED, 1), []),  # claimed, the tool not called yet
        ((EffectState.CLAIMED, 1), [False]),  # called, its outcome not recorded
        ((EffectState.DONE, 1), [False]),  # called and recorded
    ), (state, ran)
    again = [] if state[0] is EffectState.DONE else [state[0] is EffectState.CLAIMED]

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [(SUM, False)]
    assert [e["redelivery"] for e in executions(r)] == ran + again
    with r.ledger() as ledger:
        effect = ledger.effects.get("turn/1/s1/0")
        # A claim the crash cut short is given back at recovery: it is not counted.
        assert (effect.state, effect.attempts) == (EffectState.DONE, 1)
        assert run_events(ledger, 1).count("action_resolved") == 1
        assert ledger.runs.get("turn:1").status == "answered"
    assert len(r.model.requests()) == 2  # the step was recorded: not asked for it again
    assert second.terminate() == 0


def test_tool_done_before_resolve(tool_rig: Callable[..., Rig]) -> None:
    r = tool_rig(tool_script())
    first = r.start(env=armed("gateway.tool_done_before_resolve"))
    r.telegram.inject(text="add 1 and 2")
    died_at(first)
    assert len(executions(r)) == 1
    with r.ledger() as ledger:
        assert ledger.effects.get("turn/1/s1/0").state is EffectState.DONE
        assert "action_resolved" not in run_events(ledger, 1)  # T4 never committed

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [(SUM, False)]
    assert len(executions(r)) == 1  # read back from the outbox, never run again
    with r.ledger() as ledger:
        (resolved,) = [e for e in ledger.runs.events("turn:1") if e.type == "action_resolved"]
        assert resolved.payload["request"]["result"] == {"sum": 3}
        assert ledger.runs.get("turn:1").status == "answered"
    assert second.terminate() == 0


def test_interrupt_recorded_before_withdraw(rig: Callable[..., Rig], store_url: str) -> None:
    r = rig(
        [
            {"kind": "stall_mid_stream", "text": FIRST_PARTIAL, "after_chars": 16, "seconds": 600},
            {"kind": "text", "text": SECOND},
        ],
        db=store_url,
    )
    first = r.start(env=armed("gateway.interrupt_recorded_before_withdraw"))
    r.telegram.inject(text="first question")
    wait_for(lambda: len(r.telegram.shown()) == 1, what="the first message's preview")
    r.telegram.inject(text="second question")
    died_at(first)
    with r.ledger() as ledger:
        assert ledger.runs.get("turn:1").status == "interrupting"
        assert ledger.inbound.get(1).status is InboundState.ANSWERING

    second = r.start()
    r.wait_status(2, InboundState.DELIVERED)
    assert bot_messages(r) == [(SECOND, False)]  # the first preview deleted, never finished
    assert_interrupted(r, 1, by=2, reason="superseded")
    assert_answered_once(r, 2, SECOND)
    assert len(r.model.requests()) == 2  # the interrupted turn was never asked again
    assert second.terminate() == 0


def test_preview_in_flight_at_commit(rig: Callable[..., Rig], store_url: str) -> None:
    """The first edit is parked on the platform when the answer commits: the commit does not
    wait for it. After the restart that edit is ambiguous, replayed, and the message shows
    the answer once, unmarked (an edit replayed cannot make a second copy)."""
    r = rig(
        [{"kind": "text", "text": ANSWER, "chunk_chars": 8, "delay_per_chunk": 0.05}],
        db=store_url,
    )
    r.telegram.fault("hold", op="edit", hold_seconds=600)
    first = r.start(env=armed("gateway.preview_in_flight_at_commit"))
    r.telegram.inject(text="hello")
    died_at(first)
    assert r.telegram.faults_fired() == ["hold"]
    with r.ledger() as ledger:
        assert ledger.inbound.get(1).status is InboundState.ANSWERED  # T5 committed
        reply = ledger.replies.for_inbound(1)
        assert reply is not None and reply.final_text == ANSWER
        assert [op.state for op in ledger.replies.ops(reply.id)][-1] == "in_flight"

    gateway = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [(ANSWER, False)]
    assert_answered_once(r, 1, ANSWER)
    assert len(r.model.requests()) == 1  # answered before the kill: never asked again
    assert gateway.terminate() == 0


def test_every_gateway_crash_point_has_a_scenario() -> None:
    here = {
        name.removeprefix("test_")
        for name, value in globals().items()
        if name.startswith("test_") and callable(value)
    }
    registered = {
        name.removeprefix("gateway.") for name in crash.registry() if name.startswith("gateway.")
    }
    assert registered, "no gateway.* crash point is registered"
    assert registered <= here, f"no scenario for {sorted(registered - here)}"
