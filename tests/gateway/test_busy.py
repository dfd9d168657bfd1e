"""Busy modes through the real ``gateway run`` process: a message arriving while its session's
turn runs interrupts it (the default), waits its turn (``busy_mode = "queue"``, or ``/queue``),
or ``/stop`` stops it. What the user sees is read from the fake Bot API's journal; what
happened, from the store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import parse_config
from oncewire.gateway.sessions import NOTHING_TO_STOP, STOPPED_NOTE, interrupt_running_turn
from oncewire.inbound import Inbound, InboundState
from oncewire.ledger import Ledger
from oncewire.replies import TELEGRAM_LIKE, ReplyState
from oncewire.runs import TurnSession
from tests.conftest import wait_for
from tests.gateway.test_runner import Rig, assert_answered_once, bot_messages

pytestmark = pytest.mark.empty_store  # the gateway creates its store

FIRST_PARTIAL = "The first answer, which never gets to finish."
SECOND = "The answer to the second message."


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(script: Any, *, busy_mode: str = "interrupt", db: str | None = None) -> Rig:
        made.append(Rig(tmp_path, script, db or str(tmp_path / "gateway.db")))
        text = made[-1].config.read_text(encoding="utf-8")
        made[-1].config.write_text(
            text.replace("[turns]\n", f'[turns]\nbusy_mode = "{busy_mode}"\n'), encoding="utf-8"
        )
        return made[-1]

    yield make
    for one in made:
        one.stop()


def stalled_first() -> dict[str, Any]:
    """A first answer that shows a preview, then hangs mid-stream."""
    return {
        "kind": "stall_mid_stream",
        "text": FIRST_PARTIAL,
        "after_chars": 16,
        "chunk_chars": 4,
        "seconds": 600,
    }


def preview_shown(r: Rig) -> None:
    wait_for(lambda: len(r.telegram.shown()) == 1, what="the first message's preview")
    (preview,) = r.telegram.shown()
    assert FIRST_PARTIAL.startswith(preview.text) and preview.text


def assert_interrupted(r: Rig, inbound_id: int, by: int, reason: str) -> None:
    """The message was superseded by ``by``, its turn ended ``interrupted``, its reply
    withdrawn, and nothing of its answer is on the screen."""
    with r.ledger() as ledger:
        inbound = ledger.inbound.get(inbound_id)
        assert (inbound.status, inbound.answered_by) == (InboundState.SUPERSEDED, by)
        run = ledger.runs.get(f"turn:{inbound_id}")
        assert (run.status, run.terminal_reason) == ("interrupted", reason)
        reply = ledger.replies.for_inbound(inbound_id)
        assert reply is not None and reply.state is ReplyState.WITHDRAWN
        assert all(v.ok for v in ledger.runs.verify())
    assert not any(FIRST_PARTIAL.startswith(text) for text, _ in bot_messages(r))
    deletes = [c for c in r.telegram.calls() if c["method"] == "deleteMessage"]
    assert len(deletes) >= 1, r.telegram.calls()


def test_a_new_message_interrupts_the_running_turn_and_is_answered_once(
    rig: Callable[..., Rig], store_url: str
) -> None:
    """B2: message 1's preview is deleted, message 1 superseded by 2, its turn interrupted;
    message 2 answered once."""
    r = rig([stalled_first(), {"kind": "text", "text": SECOND}], db=store_url)
    gateway = r.start()
    r.telegram.inject(text="first question")
    preview_shown(r)
    r.telegram.inject(text="second question")
    r.wait_status(2, InboundState.DELIVERED)
    assert bot_messages(r) == [(SECOND, False)]
    assert_interrupted(r, 1, by=2, reason="superseded")
    assert_answered_once(r, 2, SECOND)
    requests = r.model.requests()
    assert len(requests) == 2
    # The interrupted message is the history of the one that interrupted it, with no answer.
    assert requests[1]["body"]["messages"] == [
        {"role": "user", "content": "first question"},
        {"role": "user", "content": "second question"},
    ]
    assert gateway.terminate() == 0


@pytest.mark.parametrize(
    ("busy_mode", "sent", "seen"),
    [
        ("queue", "second question", "second question"),
        ("interrupt", "/queue second question", "second question"),
    ],
)
def test_a_queued_message_waits_and_both_are_answered_in_order(
    rig: Callable[..., Rig], busy_mode: str, sent: str, seen: str
) -> None:
    """B1: the running turn finishes; then the queued message is answered; each once."""
    first = "The first answer, streamed slowly but completely."
    r = rig(
        [
            {"kind": "text", "text": first, "chunk_chars": 4, "delay_per_chunk": 0.1},
            {"kind": "text", "text": SECOND},
        ],
        busy_mode=busy_mode,
    )
    gateway = r.start()
    r.telegram.inject(text="first question")
    wait_for(lambda: len(r.telegram.shown()) == 1, what="the first message's preview")
    r.telegram.inject(text=sent)
    r.wait_status(2, InboundState.RECEIVED)
    r.wait_status(2, InboundState.DELIVERED)
    assert bot_messages(r) == [(first, False), (SECOND, False)]
    assert_answered_once(r, 1, first)
    assert_answered_once(r, 2, SECOND)
    requests = r.model.requests()
    assert len(requests) == 2
    assert requests[1]["body"]["messages"] == [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": seen},
    ]
    assert gateway.terminate() == 0


def test_stop_interrupts_the_running_turn_and_confirms_it(rig: Callable[..., Rig]) -> None:
    r = rig([stalled_first()], busy_mode="queue")  # /stop stops in either mode
    gateway = r.start()
    r.telegram.inject(text="first question")
    preview_shown(r)
    r.telegram.inject(text="/stop")
    r.wait_status(2, InboundState.DELIVERED)
    assert bot_messages(r) == [(STOPPED_NOTE, False)]
    assert_interrupted(r, 1, by=2, reason="stop")
    with r.ledger() as ledger:
        reply = ledger.replies.for_inbound(2)
        assert reply is not None and reply.final_text == STOPPED_NOTE
    # With nothing running, /stop says so.
    r.telegram.inject(text="/stop")
    r.wait_status(3, InboundState.DELIVERED)
    assert bot_messages(r) == [(STOPPED_NOTE, False), (NOTHING_TO_STOP, False)]
    assert len(r.model.requests()) == 1  # neither /stop asked the model
    assert gateway.terminate() == 0


@pytest.mark.crash
def test_a_gateway_killed_after_the_interrupt_is_recorded_finishes_it_after_a_restart(
    rig: Callable[..., Rig],
) -> None:
    """The preview's edit is parked on the platform, so the interrupted worker waits for its
    previewer: killed then, the next process ends the turn from the rows (never resumed),
    deletes the preview and answers message 2 once."""
    r = rig(
        [
            {"kind": "text", "text": FIRST_PARTIAL * 2, "chunk_chars": 4, "delay_per_chunk": 0.3},
            {"kind": "text", "text": SECOND},
        ]
    )
    r.telegram.fault("hold", op="edit", hold_seconds=600)
    first = r.start()
    r.telegram.inject(text="first question")
    wait_for(lambda: r.telegram.faults_fired() == ["hold"], what="the preview's edit to park")
    assert len(r.telegram.shown()) == 1
    r.telegram.inject(text="second question")

    def interrupt_recorded() -> bool:
        with r.ledger() as ledger:
            return bool(ledger.runs.get("turn:1").status == "interrupting")

    wait_for(interrupt_recorded, what="the interrupt of turn:1 to be recorded")
    first.kill()
    with r.ledger() as ledger:
        assert ledger.runs.get("turn:1").status == "interrupting"  # killed before its end
        assert ledger.inbound.get(1).status is InboundState.ANSWERING

    second = r.start()
    r.wait_status(2, InboundState.DELIVERED)
    assert bot_messages(r) == [(SECOND, False)]
    assert_interrupted(r, 1, by=2, reason="superseded")
    assert_answered_once(r, 2, SECOND)
    with r.ledger() as ledger:
        events = [e.type for e in ledger.runs.events("turn:1")]
    assert events == ["run_started", "interrupt_requested", "run_resumed", "run_terminated"]
    assert len(r.model.requests()) == 2  # message 1's turn was never asked again
    assert second.terminate() == 0


@pytest.mark.parametrize("mode", ["steer", "reject"])
def test_busy_modes_not_built_yet_are_refused_at_config_load(mode: str) -> None:
    text = f'[turns]\nbusy_mode = "{mode}"\n\n[[platforms]]\nname = "t"\nkind = "telegram"\n'
    with pytest.raises(ConfigurationError, match="not supported yet") as caught:
        parse_config(text, "gateway.toml")
    assert f"[turns] busy_mode: {mode!r}" in str(caught.value)


def test_the_busy_decision_reads_the_mode_the_prefix_and_the_turn(tmp_path: Path) -> None:
    """Queue mode and /queue leave the running turn alone; an interrupt is recorded once, by the
    first message that asks; a message for another session touches nothing."""
    with Ledger(str(tmp_path / "busy.db")) as ledger:

        def admit(message_id: str, text: str, chat: str = "7") -> Inbound:
            admitted = ledger.inbound.admit("tg", "1", chat, message_id, {"text": text})
            return admitted.inbound

        running = admit("1", "first")
        with ledger.transaction() as tx:
            ledger.inbound.start_in_tx(tx, running.id)
            ledger.replies.open_in_tx(tx, running.id, TELEGRAM_LIKE)
            ledger.runs.turn.start_in_tx(
                tx, running.id, TurnSession("tg", "1", "7", ""), owner="me", lease_seconds=60.0
            )
        assert interrupt_running_turn(ledger, admit("2", "plain"), "queue") is None
        assert interrupt_running_turn(ledger, admit("3", "/queue later"), "interrupt") is None
        assert interrupt_running_turn(ledger, admit("4", "hi", chat="8"), "interrupt") is None
        assert ledger.runs.get(f"turn:{running.id}").status == "running"
        newer = admit("5", "actually, this")
        assert interrupt_running_turn(ledger, newer, "interrupt") == running.id
        run = ledger.runs.get(f"turn:{running.id}")
        assert run.status == "interrupting"
        assert run.state["interrupt"]["by"] == newer.id
        assert interrupt_running_turn(ledger, admit("6", "/stop"), "queue") is None  # one is enough
        assert ledger.runs.get(f"turn:{running.id}").state["interrupt"]["by"] == newer.id
