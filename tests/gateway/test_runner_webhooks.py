"""``oncewire gateway run`` serving platforms that push their messages, end to end: the fake Bot
API in webhook mode and the fake generic webhook platform POST to the gateway's webhook server
(real child processes, :mod:`tests.gateway.push_rig`). A message is admitted before its POST is
answered 2xx, answered once through its platform's adapter, and a re-delivered POST is a
re-delivery, not a second turn. Checked from the fakes' journals and the store, read directly."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from oncewire.gateway.admission import WEBHOOK_BOT
from oncewire.inbound import InboundState
from tests.conftest import _child_env, wait_for
from tests.gateway.push_rig import ENV, NE, TG, PushRig, by_token
from tests.gateway.test_telegram_wire import TOKEN

pytestmark = pytest.mark.empty_store  # the gateway creates its store

BOT = TOKEN.split(":")[0]


@pytest.fixture
def push_rig(tmp_path: Path) -> Iterator[Callable[..., PushRig]]:
    made: list[PushRig] = []

    def make(script: Any, *, db: str | None = None, **options: Any) -> PushRig:
        made.append(PushRig(tmp_path, script, db or str(tmp_path / "gateway.db"), **options))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def test_messages_pushed_by_telegram_and_a_webhook_platform_are_each_answered_once(
    push_rig: Callable[..., PushRig], store_url: str
) -> None:
    tg_answer = "Telegram, answered through the webhook server."
    ne_answer = "The webhook platform, answered by one POST."
    r = push_rig(by_token({"[tg-1]": tg_answer, "[ne-1]": ne_answer}), db=store_url)
    gateway = r.start()
    sent = r.telegram.inject(chat="4242", text="[tg-1] hello over a webhook")
    r.hook.call("inject", chat="ne-chat", text="[ne-1] hello from a platform that cannot edit")
    wait_for(
        lambda: sum(i.status is InboundState.DELIVERED for i in r.inbounds()) == 2,
        timeout=60,
        what="both messages delivered",
    )

    r.assert_delivered_once(TG, "4242", tg_answer)
    r.assert_delivered_once(NE, "ne-chat", ne_answer)
    with r.ledger() as ledger:
        keys = {(i.platform, i.bot, i.chat, i.platform_message_id) for i in ledger.inbound.list()}
    assert keys == {(TG, BOT, "4242", str(sent["message_id"])), (NE, WEBHOOK_BOT, "ne-chat", "u1")}
    assert r.model_requests_for("[tg-1]") == 1 and r.model_requests_for("[ne-1]") == 1
    # Each platform saw its message confirmed by a 2xx, once: nothing was delivered again.
    assert [d["status"] for d in r.telegram.call("state")["deliveries"]] == [200]
    (delivery,) = r.hook.call("state")["inbound"]
    assert (delivery["attempts"], delivery["delivered"]) == (1, True)
    # The webhook platform got one POST for its reply (it cannot edit: no preview).
    hook_posts = [c for c in _calls(r.hook.directory) if c["path"] == "/messages"]
    assert [c["status"] for c in hook_posts] == [200]
    assert gateway.terminate() == 0


def _calls(directory: Path) -> list[dict[str, Any]]:
    path = directory / "calls.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_webhook_message_with_a_wrong_signature_is_refused_before_admission(
    push_rig: Callable[..., PushRig],
) -> None:
    answer = "Answered once, after the signed delivery."
    r = push_rig(by_token({"[sig]": answer}))
    gateway = r.start()
    message = {"message_id": "m-1", "chat": "sig-chat", "text": "[sig] who am I"}
    assert r.post_message(r.port, message, secret="not-the-secret") == 401
    assert r.post_message(r.port, {**message, "text": "[sig] tampered"}, secret="") == 401
    assert r.inbounds() == []  # nothing admitted, so nothing to answer
    assert r.model.requests() == []

    # The same message, signed: admitted (it is the store's first message) and answered.
    r.hook.call("inject", chat="sig-chat", text="[sig] who am I", message_id="m-1")
    r.wait_status(1, InboundState.DELIVERED)
    r.assert_delivered_once(NE, "sig-chat", answer)
    assert r.model_requests_for("[sig]") == 1
    assert gateway.terminate() == 0


def test_a_redelivered_post_of_the_same_message_id_is_admitted_once(
    push_rig: Callable[..., PushRig], store_url: str
) -> None:
    ne_answer, tg_answer = "Answered once, delivered twice.", "One turn for two POSTs."
    r = push_rig(by_token({"[re-ne]": ne_answer, "[re-tg]": tg_answer}), db=store_url)
    gateway = r.start()
    assert gateway.port is not None
    r.hook.call("inject", chat="re-chat", text="[re-ne] say it once")
    sent = r.telegram.inject(chat="5151", text="[re-tg] say it once")
    wait_for(
        lambda: sum(i.status is InboundState.DELIVERED for i in r.inbounds()) == 2,
        timeout=60,
        what="both messages delivered",
    )

    # The webhook platform delivers its message again (a platform's retry)...
    r.hook.call("redeliver", message_id="u1")
    wait_for(
        lambda: r.hook.call("state")["inbound"][0]["attempts"] == 2,
        what="the second delivery",
    )
    assert r.hook.call("state")["inbound"][0]["delivered"] is True
    # ...and Telegram POSTs the same update again (the same chat and message id).
    update = {
        "update_id": 900001,
        "message": {
            "message_id": sent["message_id"],
            "date": 0,
            "chat": {"id": 5151, "type": "private"},
            "from": {"id": 1001, "is_bot": False, "first_name": "User"},
            "text": "[re-tg] say it once",
        },
    }
    assert r.post_update(gateway.port, update) == 200
    assert r.post_update(gateway.port, update) == 200

    with r.ledger() as ledger:
        assert len(ledger.inbound.list(limit=1000)) == 2  # one row per message, not per POST
    # No second turn was started: still one model request each, one visible answer each.
    wait_for(lambda: gateway.process.poll() is None, what="the gateway to stay up")
    assert gateway.terminate() == 0
    r.assert_delivered_once(NE, "re-chat", ne_answer)
    r.assert_delivered_once(TG, "5151", tg_answer)
    assert r.model_requests_for("[re-ne]") == 1 and r.model_requests_for("[re-tg]") == 1
    with r.ledger() as ledger:
        assert all(i.attempts == 1 for i in ledger.inbound.list(limit=1000))


def test_bind_port_0_is_printed_on_the_ready_line_and_the_drain_closes_it(
    push_rig: Callable[..., PushRig],
) -> None:
    answer = "Reached on the port the ready line named."
    r = push_rig(by_token({"[p0]": answer}), port=0)
    gateway = r.start()
    port = gateway.port
    assert port is not None and port > 0
    assert httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=10).json() == {"ok": True}
    r.set_telegram_webhook(port)
    r.telegram.inject(chat="7070", text="[p0] which port")
    r.wait_status(1, InboundState.DELIVERED)
    r.assert_delivered_once(TG, "7070", answer)

    assert gateway.terminate() == 0
    assert "draining" in gateway.log_text()
    with socket.socket() as sock, pytest.raises(ConnectionRefusedError):
        sock.connect(("127.0.0.1", port))


def test_a_webhook_platform_without_secret_env_stops_the_start_before_the_store_is_made(
    tmp_path: Path,
) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[store]
db = "gateway.db"

[model]
base_url = "http://127.0.0.1:9/v1"
api_key_env = ""
model = "fake-model"

[[platforms]]
name = "{NE}"
kind = "webhook"
send_url = "http://127.0.0.1:9/messages"
streaming = false
""",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "oncewire", "gateway", "run", "--config", str(config)],
        env=_child_env(**ENV),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "secret_env" in done.stderr and NE in done.stderr
    assert done.stdout == ""  # never ready
    assert not (tmp_path / "gateway.db").exists()
