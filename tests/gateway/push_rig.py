"""A real ``oncewire gateway run`` whose platforms push their messages: the fake Bot API in
webhook mode (``fk_tg``, streaming on) and the fake generic webhook platform (``fk_ne``,
non-editable, streaming off), both POSTing to the gateway's webhook server, with the fake
OpenAI-compatible server as the model. Every piece is a child process; what the user sees is
read from the fakes' journals (ChatView), what happened from the store.

How the harness learns the gateway's port: ``[webhooks] bind`` names a port chosen here before
the fakes start (:func:`~oncewire.lab.ports.stable_port`, below the ephemeral range so nothing
else takes it while the gateway is down), so the webhook fake's ``--deliver-to`` and the Bot
API fake's webhook URL are known up front and survive a gateway restart on the same port. With
``bind`` port 0 the gateway prints the port it bound on its ready line (``ready port=N``;
:attr:`GatewayProcess.port`); the Bot API's webhook can then be set afterwards
(:meth:`PushRig.set_telegram_webhook`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2

from oncewire import Ledger
from oncewire.gateway.config import RESUME_NOTE
from oncewire.gateway.platforms.telegram import TelegramBot
from oncewire.gateway.platforms.webhook import sign
from oncewire.gateway.webhooks import TELEGRAM_SECRET_HEADER, telegram_webhook_path
from oncewire.inbound import Inbound, InboundState
from oncewire.lab.ports import stable_port
from oncewire.replies import ReplyState
from oncewire.testing.fake_platform import ChatView, VisibleMessage
from tests.conftest import _child_env, wait_for
from tests.gateway.conftest import FakeOpenAI
from tests.gateway.test_telegram_wire import TOKEN, FakeTelegram
from tests.gateway.test_webhook_platform import SECRET as HOOK_SECRET
from tests.gateway.test_webhook_platform import FakeWebhook

TG = "fk_tg"
NE = "fk_ne"
TG_SECRET = "tg-webhook-secret-for-tests"
ENV = {
    "TELEGRAM_BOT_TOKEN": TOKEN,
    "TG_WEBHOOK_SECRET": TG_SECRET,
    "HOOK_SECRET": HOOK_SECRET,
}


def by_token(answers: dict[str, str]) -> dict[str, Any]:
    """A model script answering each ``TOKEN`` (in the last user message) with its text."""
    return {
        "by_token": {token: [{"kind": "text", "text": text}] for token, text in answers.items()}
    }


class GatewayProcess:
    """A running ``python -m oncewire gateway run`` in a process group of its own. ``port`` is
    the webhook server's port from the ready line (None when the gateway serves none)."""

    def __init__(
        self,
        config: Path,
        log: Path,
        *,
        env: dict[str, str] | None = None,
        grace_seconds: float = 20.0,
    ) -> None:
        self.log = log
        with open(log, "a", encoding="utf-8") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "oncewire",
                    "gateway",
                    "run",
                    "--config",
                    str(config),
                    "--grace-seconds",
                    str(grace_seconds),
                ],
                env=_child_env(**(ENV if env is None else env)),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        self.port: int | None = None
        if line.startswith("ready port="):
            self.port = int(line.split("=", 1)[1])
        elif line != "ready":
            self.kill()
            raise AssertionError(f"the gateway did not start: {line!r}\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8")

    def kill(self) -> None:
        """SIGKILL the whole process group: no drain, no cleanup."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self._close()

    def terminate(self, timeout: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Where it is stuck: every thread's stack (SIGUSR1, faulthandler) into the log.
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            self.kill()
            raise AssertionError(
                f"the gateway did not stop {timeout:.0f}s after SIGTERM\n{self.log_text()}"
            ) from None
        self._close()
        return code

    def _close(self) -> None:
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()


class PushRig:
    """The fakes, a gateway.toml serving ``fk_tg`` (webhook mode) and ``fk_ne`` on a fixed
    loopback port (``port=0``: any port, learned from the ready line), and the store."""

    def __init__(
        self,
        tmp_path: Path,
        script: Any,
        db: str,
        *,
        port: int | None = None,
        turns: str = "max_concurrent = 2",
        telegram: str = "",
        telegram_faults: tuple[dict[str, Any], ...] = (),
    ) -> None:
        self.tmp_path = tmp_path
        self.db = db
        self.port = stable_port() if port is None else port
        self.model = FakeOpenAI(tmp_path / "openai", script)
        self.telegram = FakeTelegram(tmp_path / "tg", *telegram_faults)
        deliver_to = f"http://127.0.0.1:{self.port or stable_port()}/webhook/{NE}"
        self.hook = FakeWebhook(tmp_path / "ne", deliver_to)
        self.config = tmp_path / "gateway.toml"
        self.config.write_text(
            f"""
[store]
db = {json.dumps(db)}

[model]
base_url = "{self.model.base_url}"
api_key_env = ""
model = "fake-model"
max_retries = 1
read_timeout = 60

[turns]
{turns}

[[platforms]]
name = "{TG}"
kind = "telegram"
token_env = "TELEGRAM_BOT_TOKEN"
api_base = "{self.telegram.base}"
inbound = "webhook"
webhook_secret_env = "TG_WEBHOOK_SECRET"
streaming = true
edit_interval_seconds = 0.05
{telegram}

[[platforms]]
name = "{NE}"
kind = "webhook"
send_url = "{self.hook.base}/messages"
secret_env = "HOOK_SECRET"
streaming = false

[webhooks]
bind = "127.0.0.1:{self.port}"
""",
            encoding="utf-8",
        )
        self.gateways: list[GatewayProcess] = []
        self.http = httpx2.Client(timeout=30.0)
        if self.port:
            self.set_telegram_webhook(self.port)

    # -- the gateway -----------------------------------------------------------------------
    def start(self, grace_seconds: float = 20.0) -> GatewayProcess:
        gateway = GatewayProcess(
            self.config, self.tmp_path / "gateway.log", grace_seconds=grace_seconds
        )
        self.gateways.append(gateway)
        assert gateway.port is not None, "a gateway with webhook platforms prints its port"
        if self.port:
            assert gateway.port == self.port
        return gateway

    def set_telegram_webhook(self, port: int) -> None:
        """Have the fake Bot API POST its updates to the gateway listening on ``port``."""
        bot = TelegramBot(TOKEN, api_base=self.telegram.base)
        try:
            bot.set_webhook(self.telegram_url(port), TG_SECRET)
        finally:
            bot.close()

    def telegram_url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}{telegram_webhook_path(TG, TG_SECRET)}"

    def webhook_url(self, port: int) -> str:
        return f"http://127.0.0.1:{port}/webhook/{NE}"

    # -- POSTs as a platform would make them -----------------------------------------------
    def post_update(self, port: int, update: dict[str, Any], secret: str = TG_SECRET) -> int:
        """POST one Telegram update to the gateway; its status."""
        answer = self.http.post(
            self.telegram_url(port), json=update, headers={TELEGRAM_SECRET_HEADER: secret}
        )
        return answer.status_code

    def post_message(self, port: int, message: dict[str, Any], secret: str = HOOK_SECRET) -> int:
        """POST one generic webhook message to the gateway, signed with ``secret``; its status."""
        body = json.dumps(message).encode()
        answer = self.http.post(
            self.webhook_url(port),
            content=body,
            headers={"content-type": "application/json", "Oncewire-Signature": sign(secret, body)},
        )
        return answer.status_code

    # -- what the user sees ----------------------------------------------------------------
    def shown(self, platform: str, chat: str) -> list[VisibleMessage]:
        directory = self.telegram.directory if platform == TG else self.hook.directory
        return ChatView([directory / "chat.jsonl"]).visible(platform, chat)

    def telegram_calls(self, chat: str | None = None) -> list[dict[str, Any]]:
        """The Bot API calls the fake answered (not its webhook deliveries), for ``chat`` or
        every chat."""
        path = self.telegram.directory / "calls.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines()
        calls = [c for c in map(json.loads, lines) if "method" in c]
        return [c for c in calls if chat is None or str(c["params"].get("chat_id")) == chat]

    # -- the store -------------------------------------------------------------------------
    def ledger(self) -> Ledger:
        return Ledger(self.db, create=False)

    def inbounds(self) -> list[Any]:
        with self.ledger() as ledger:
            return list(ledger.inbound.list(limit=1000))

    def inbound_in(self, platform: str, chat: str) -> list[Inbound]:
        """The chat's inbound rows, oldest first."""
        return [i for i in self.inbounds() if (i.platform, i.chat) == (platform, chat)]

    def model_requests_for(self, token: str) -> int:
        """The model requests of the turn whose message carries ``token``: its newest user
        message has it, or, in a resumed turn's request, the one before the resume note. (The
        earlier messages of the chat are the request's history, not its turn.)"""
        count = 0
        for request in self.model.requests():
            users = [str(m["content"]) for m in request["body"]["messages"] if m["role"] == "user"]
            if users and users[-1] == RESUME_NOTE:
                users.pop()
            if users and token in users[-1]:
                count += 1
        return count

    def assert_delivered_once(self, platform: str, chat: str, text: str) -> None:
        """One inbound in that chat, answered and delivered with ``text``, and the chat shows
        that text once, unmarked, and nothing else."""
        with self.ledger() as ledger:
            rows = [
                i
                for i in ledger.inbound.list(limit=1000)
                if (i.platform, i.chat) == (platform, chat)
            ]
            assert len(rows) == 1, rows
            (inbound,) = rows
            assert inbound.status is InboundState.DELIVERED
            reply = ledger.replies.for_inbound(inbound.id)
            assert reply is not None and reply.state is ReplyState.DELIVERED
            assert reply.final_text == text
            assert ledger.runs.get(f"turn:{inbound.id}").status == "answered"
        assert [m.text for m in self.shown(platform, chat)] == [text]

    def wait_status(self, inbound_id: int, status: InboundState, timeout: float = 60.0) -> None:
        def reached() -> bool:
            return any(i.id == inbound_id and i.status is status for i in self.inbounds())

        wait_for(reached, timeout=timeout, what=f"inbound {inbound_id} to be {status}")

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.kill()
        self.http.close()
        self.telegram.stop()
        self.hook.stop()
        self.model.stop()
