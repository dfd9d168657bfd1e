"""Behaviours beyond seed 002 (GATEWAY.md §1.7), each through a real ``oncewire gateway run``
serving the fake Bot API (``fk_tg``, webhook mode, streaming) and the fake webhook platform
(``fk_ne``, non-editable) with the fake model, all child processes (:mod:`tests.gateway.push_rig`).
What the user sees is read from the fakes' journals and call logs; what happened, from the
store read directly. Where the store matters, on SQLite and PostgreSQL.

Covered elsewhere, not repeated here: a turn that raises in process is taken over and
quarantined past ``max_starts`` (test_runner_retry.py); SIGTERM letting a turn finish, or
leaving it to the next start after the grace period (test_runner.py); ``/stop`` on Telegram
(test_busy.py); a webhook message with a wrong signature (test_runner_webhooks.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire.gateway.sessions import STOPPED_NOTE
from oncewire.gateway.status import session_status
from oncewire.gateway.turn import SET_ASIDE_TEXT
from oncewire.inbound import InboundState
from oncewire.replies import NON_EDITABLE, TELEGRAM_LIKE, ReplyState
from oncewire.replies.engine import DEFAULT_NOTICE
from oncewire.testing.fake_platform import ChatView
from tests.conftest import wait_for
from tests.gateway.push_rig import NE, TG, PushRig, by_token

pytestmark = pytest.mark.empty_store  # the gateway creates its store


@pytest.fixture
def push_rig(tmp_path: Path) -> Iterator[Callable[..., PushRig]]:
    made: list[PushRig] = []

    def make(script: Any, *, db: str | None = None, **options: Any) -> PushRig:
        made.append(PushRig(tmp_path, script, db or str(tmp_path / "gateway.db"), **options))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def tg_calls(r: PushRig, chat: str, method: str) -> list[dict[str, Any]]:
    return [c for c in r.telegram_calls(chat) if c["method"] == method]


def delivered(r: PushRig, platform: str, chat: str) -> bool:
    rows = r.inbound_in(platform, chat)
    return bool(rows) and all(i.status is InboundState.DELIVERED for i in rows)


def no_marked_copy(r: PushRig) -> None:
    """Nothing on either platform carries the duplicate marker."""
    for directory, profile in (
        (r.telegram.directory, TELEGRAM_LIKE),
        (r.hook.directory, NON_EDITABLE),
    ):
        for message in ChatView([directory / "chat.jsonl"]).messages:
            assert not profile.strip_marker(message.text)[1], message


@pytest.mark.crash
def test_a_poison_message_is_quarantined_on_its_own_while_others_go_on(
    push_rig: Callable[..., PushRig], store_url: str
) -> None:
    """A message whose turn takes the gateway down every time (here: the model hangs and the
    process is SIGKILLed, twice) is set aside at the start past ``max_starts``, without asking
    the model again, and its reply says so; the message queued behind it in its chat and
    another chat are answered."""
    hang = {"kind": "hang", "seconds": 600}
    script: dict[str, Any] = {"by_token": {"[poison]": [hang]}, "resume": {"[poison]": [hang]}}
    script["by_token"].update(
        by_token({"[other]": "Another chat goes on.", "[next]": "Next."})["by_token"]
    )
    r = push_rig(script, db=store_url, turns="max_concurrent = 2\nmax_starts = 2")
    first = r.start()
    r.telegram.inject(chat="31", text="[poison] the message that never finishes")
    wait_for(lambda: r.model_requests_for("[poison]") == 1, what="the poison's first request")
    r.hook.call("inject", chat="other", text="[other] meanwhile, elsewhere")
    wait_for(lambda: delivered(r, NE, "other"), timeout=60, what="the other chat's answer")
    first.kill()

    second = r.start()
    wait_for(lambda: r.model_requests_for("[poison]") == 2, what="the poison's resumed request")
    r.telegram.inject(chat="31", text="/queue [next] after the poison")
    wait_for(lambda: len(r.inbound_in(TG, "31")) == 2, what="the next message's admission")
    second.kill()

    third = r.start()
    wait_for(lambda: delivered(r, TG, "31") is False and _quarantined(r), what="quarantine")
    wait_for(
        lambda: r.inbound_in(TG, "31")[1].status is InboundState.DELIVERED,
        timeout=60,
        what="the message behind the poison to be answered",
    )
    poison, after = r.inbound_in(TG, "31")
    with r.ledger() as ledger:
        poison = ledger.inbound.get(poison.id)
        assert (poison.status, poison.attempts) == (InboundState.QUARANTINED, 3)
        run = ledger.runs.get(f"turn:{poison.id}")
        assert (run.status, run.terminal_reason) == ("failed", "quarantined")
        reply = ledger.replies.for_inbound(after.id)
        assert reply is not None and reply.final_text == "Next."
        assert all(v.ok for v in ledger.runs.verify())
        (status,) = session_status(ledger)  # only the quarantined message is left pending
        assert (status.chat, status.quarantined, status.active_turn) == ("31", 1, None)
    assert r.model_requests_for("[poison]") == 2  # the third start did not ask again
    assert r.model_requests_for("[next]") == 1
    assert [m.text for m in r.shown(TG, "31")] == [SET_ASIDE_TEXT.format(starts=2), "Next."]
    r.assert_delivered_once(NE, "other", "Another chat goes on.")
    assert third.terminate() == 0


def _quarantined(r: PushRig) -> bool:
    return any(i.status is InboundState.QUARANTINED for i in r.inbounds())


def test_a_long_retry_after_is_scheduled_on_the_record_while_other_chats_keep_flowing(
    push_rig: Callable[..., PushRig], store_url: str
) -> None:
    """Telegram answers a chat's sends with 429 retry_after = 300 s: the reply waits on its
    record (not in a sleeping thread), and other chats, on both platforms, are answered."""
    answers = {"[slow]": "Five minutes later.", "[tg2]": "Not held up.", "[ne2]": "Nor this."}
    r = push_rig(by_token(answers), db=store_url)
    r.telegram.call("fault", kind="rate_limit", chat="41", op="any", times=50, retry_after=300)
    gateway = r.start()
    r.telegram.inject(chat="41", text="[slow] a chat in a flood wait")

    def scheduled() -> bool:
        rows = r.inbound_in(TG, "41")
        if not rows:
            return False
        with r.ledger() as ledger:
            reply = ledger.replies.for_inbound(rows[0].id)
        return (
            reply is not None
            and reply.state is ReplyState.COMMITTED
            and (reply.not_before > time.time() + 200)
        )

    wait_for(scheduled, timeout=60, what="the reply scheduled minutes ahead")
    refused = len(r.telegram_calls("41"))
    r.telegram.inject(chat="42", text="[tg2] another Telegram chat")
    r.hook.call("inject", chat="ne-42", text="[ne2] the webhook platform")
    wait_for(lambda: delivered(r, TG, "42"), timeout=60, what="the other Telegram chat")
    wait_for(lambda: delivered(r, NE, "ne-42"), timeout=60, what="the webhook platform's chat")
    r.assert_delivered_once(TG, "42", "Not held up.")
    r.assert_delivered_once(NE, "ne-42", "Nor this.")

    (waiting,) = r.inbound_in(TG, "41")
    assert waiting.status is InboundState.ANSWERED
    with r.ledger() as ledger:
        reply = ledger.replies.for_inbound(waiting.id)
        assert reply is not None and reply.final_text == "Five minutes later."
        assert reply.attempts == 0  # a rate limit costs no attempt
        (status,) = [s for s in session_status(ledger) if s.chat == "41"]
        assert (status.answered_not_delivered, status.scheduled) == (1, 1)
    # Nothing hammered the chat while it waited: no call since the refusal that scheduled it.
    assert len(r.telegram_calls("41")) == refused
    assert r.shown(TG, "41") == []
    assert gateway.terminate() == 0


def test_a_reply_refused_for_good_ends_dead_after_one_attempt_without_a_retry_storm(
    push_rig: Callable[..., PushRig], store_url: str
) -> None:
    """The user blocked the bot (403 on every call to the chat): the reply ends dead with the
    platform's reason, the chat is not called again, and other chats are answered."""
    r = push_rig(by_token({"[blocked]": "Never seen.", "[fine]": "Seen."}), db=store_url)
    r.telegram.call("fault", kind="rejected", chat="51", op="any", times=1000)
    gateway = r.start()
    r.telegram.inject(chat="51", text="[blocked] a user who blocked the bot")

    def dead() -> bool:
        rows = r.inbound_in(TG, "51")
        if not rows:
            return False
        with r.ledger() as ledger:
            reply = ledger.replies.for_inbound(rows[0].id)
        return reply is not None and reply.state is ReplyState.DEAD

    wait_for(dead, timeout=60, what="the reply to end dead")
    calls = r.telegram_calls("51")
    # Then another chat is answered: the gateway went on, and time passed for a storm to show.
    r.telegram.inject(chat="52", text="[fine] someone else")
    wait_for(lambda: delivered(r, TG, "52"), timeout=60, what="the other chat's answer")
    r.assert_delivered_once(TG, "52", "Seen.")

    assert r.telegram_calls("51") == calls  # no call to the blocked chat since it went dead
    # The preview's send (when the stream was slow enough for one) and the answer's send,
    # refused; then the engine's one honest "could not deliver" notice, refused too. Nothing
    # else, and nothing went through.
    texts = [c["params"]["text"] for c in calls if c["method"] == "sendMessage"]
    previews, final = texts[:-2], texts[-2:]
    assert final == ["Never seen.", DEFAULT_NOTICE], calls
    assert len(previews) <= 1 and all("Never seen.".startswith(t) for t in previews), calls
    assert all(c["status"] == 403 for c in calls)
    (inbound,) = r.inbound_in(TG, "51")
    with r.ledger() as ledger:
        reply = ledger.replies.for_inbound(inbound.id)
        assert reply is not None and reply.final_text == "Never seen."
        assert reply.last_error is not None and "403" in reply.last_error
        assert ledger.runs.get(f"turn:{inbound.id}").status == "answered"
    assert r.model_requests_for("[blocked]") == 1
    assert r.shown(TG, "51") == []
    assert gateway.terminate() == 0


def test_a_preview_deleted_by_the_user_is_sent_again_not_fatal(
    push_rig: Callable[..., PushRig],
) -> None:
    """The user deletes the streaming preview; the next edit finds "message to edit not
    found", and the answer is sent again as a new message: one complete copy, unmarked."""
    answer = "An answer whose preview the user deleted while it streamed, then finished."
    slow = {"kind": "text", "text": answer, "chunk_chars": 6, "delay_per_chunk": 0.15}
    r = push_rig({"by_token": {"[gone]": [slow]}})
    r.telegram.call("fault", kind="gone", chat="61", op="edit", times=1)
    gateway = r.start()
    r.telegram.inject(chat="61", text="[gone] stream to me")
    wait_for(lambda: delivered(r, TG, "61"), timeout=60, what="the answer to be delivered")

    r.assert_delivered_once(TG, "61", answer)
    fired = [f for f in ChatView([r.telegram.directory / "chat.jsonl"]).faults if f["chat"] == "61"]
    assert [f["kind"] for f in fired] == ["gone"]
    # The deleted preview and the message the answer was sent again in are two messages.
    sends = tg_calls(r, "61", "sendMessage")
    assert len(sends) == 2
    no_marked_copy(r)
    assert gateway.terminate() == 0


def test_busy_acknowledgements_are_truthful_and_stop_gets_its_own_reply(
    push_rig: Callable[..., PushRig],
) -> None:
    """On the webhook platform: a slow turn, a ``/queue`` follow-up, then ``/stop``. The
    stopped turn says nothing; the queued message is still answered (it was not dropped); the
    ``/stop`` gets its own confirmation; no message is left without its outcome."""
    stalled = {
        "kind": "stall_mid_stream",
        "text": "A first answer that never finishes.",
        "after_chars": 10,
        "seconds": 600,
    }
    r = push_rig(
        {"by_token": {"[t1]": [stalled]} | by_token({"[t2]": "The queued one."})["by_token"]}
    )
    gateway = r.start()
    r.hook.call("inject", chat="busy", text="[t1] take your time")
    wait_for(lambda: r.model_requests_for("[t1]") == 1, what="the first turn's request")
    r.hook.call("inject", chat="busy", text="/queue [t2] and then this")
    wait_for(lambda: len(r.inbound_in(NE, "busy")) == 2, what="the queued message's admission")
    r.hook.call("inject", chat="busy", text="/stop")
    wait_for(lambda: delivered_or_superseded(r, NE, "busy", 3), timeout=60, what="all three")

    first, queued, stop = r.inbound_in(NE, "busy")
    with r.ledger() as ledger:
        first = ledger.inbound.get(first.id)
        assert (first.status, first.answered_by) == (InboundState.SUPERSEDED, stop.id)
        run = ledger.runs.get(f"turn:{first.id}")
        assert (run.status, run.terminal_reason) == ("interrupted", "stop")
        for inbound, text in ((queued, "The queued one."), (stop, STOPPED_NOTE)):
            reply = ledger.replies.for_inbound(inbound.id)
            assert reply is not None and reply.state is ReplyState.DELIVERED
            assert reply.final_text == text
    shown = sorted(m.text for m in r.shown(NE, "busy"))
    assert shown == sorted(["The queued one.", STOPPED_NOTE])
    assert r.model_requests_for("[t1]") == 1 and r.model_requests_for("[t2]") == 1
    assert gateway.terminate() == 0


def delivered_or_superseded(r: PushRig, platform: str, chat: str, count: int) -> bool:
    rows = r.inbound_in(platform, chat)
    ended = (InboundState.DELIVERED, InboundState.SUPERSEDED)
    return len(rows) == count and all(i.status in ended for i in rows)


@pytest.mark.crash
def test_sigterm_drains_and_nothing_answered_is_marked_again(
    push_rig: Callable[..., PushRig], store_url: str
) -> None:
    """Two answers delivered, a third turn mid-stream when SIGTERM comes with a short grace
    period: the process exits 0, the third turn is left resumable, and the next start answers
    it once while the delivered answers are neither sent again nor marked."""
    stalled = {
        "kind": "stall_mid_stream",
        "text": "The third answer, cut by the drain.",
        "after_chars": 12,
        "chunk_chars": 4,
        "seconds": 600,
    }
    script = by_token({"[a]": "First, delivered.", "[b]": "Second, delivered."})
    script["resume"] = {"[c]": [{"kind": "text", "text": "The third answer, after the restart."}]}
    script["by_token"]["[c]"] = [stalled]
    r = push_rig(script, db=store_url)
    first = r.start(grace_seconds=1.0)
    r.telegram.inject(chat="71", text="[a] one")
    r.hook.call("inject", chat="ne-71", text="[b] two")
    wait_for(lambda: delivered(r, TG, "71") and delivered(r, NE, "ne-71"), timeout=60, what="a, b")
    before = (len(r.telegram_calls()), _hook_posts(r))
    r.telegram.inject(chat="72", text="[c] three")
    wait_for(lambda: len(r.shown(TG, "72")) == 1, what="the third answer's preview")
    assert first.terminate() == 0
    assert "still running after the grace period" in first.log_text()
    (third,) = r.inbound_in(TG, "72")
    assert third.status is InboundState.ANSWERING  # left resumable, not answered

    second = r.start()
    wait_for(lambda: delivered(r, TG, "72"), timeout=60, what="the resumed answer")
    r.assert_delivered_once(TG, "72", "The third answer, after the restart.")
    r.assert_delivered_once(TG, "71", "First, delivered.")
    r.assert_delivered_once(NE, "ne-71", "Second, delivered.")
    no_marked_copy(r)
    # The delivered answers were not touched: every call since is for the third chat.
    later = r.telegram_calls()[before[0] :]
    assert later and all(str(c["params"].get("chat_id")) == "72" for c in later)
    assert _hook_posts(r) == before[1]
    assert r.model_requests_for("[a]") == 1 and r.model_requests_for("[b]") == 1
    assert second.terminate() == 0


def _hook_posts(r: PushRig) -> int:
    path = r.hook.directory / "calls.jsonl"
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if "/messages" in line)


def test_a_telegram_webhook_with_a_wrong_secret_is_refused_before_admission(
    push_rig: Callable[..., PushRig], store_url: str
) -> None:
    answer = "Admitted once, from the real delivery."
    r = push_rig(by_token({"[secret]": answer}), db=store_url)
    gateway = r.start()
    assert gateway.port is not None
    update = {
        "update_id": 777,
        "message": {
            "message_id": 1000001,
            "date": 0,
            "chat": {"id": 81, "type": "private"},
            "from": {"id": 1001, "is_bot": False, "first_name": "User"},
            "text": "[secret] forged",
        },
    }
    assert r.post_update(gateway.port, update, secret="wrong-secret") == 401
    assert r.post_update(gateway.port, update, secret="") == 401
    assert r.inbounds() == [] and r.model.requests() == []

    r.telegram.inject(chat="81", text="[secret] the real one")
    wait_for(lambda: delivered(r, TG, "81"), timeout=60, what="the real message's answer")
    r.assert_delivered_once(TG, "81", answer)
    (inbound,) = r.inbound_in(TG, "81")
    assert inbound.payload["text"] == "[secret] the real one"
    assert r.model_requests_for("[secret]") == 1
    assert gateway.terminate() == 0
