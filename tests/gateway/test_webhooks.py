"""The inbound webhook server for real: uvicorn on loopback, an admission callback that commits
to a real store (a SQLite file, or PostgreSQL), and the platforms' fakes as child processes
delivering to it (the fake Bot API through setWebhook, the generic webhook platform). What was
admitted is read from the store directly, what was delivered from the fakes' own state."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from oncewire import Ledger
from oncewire.core.errors import ConfigurationError
from oncewire.gateway.admission import Admitted
from oncewire.gateway.check import check_config
from oncewire.gateway.config import GatewayConfig, PlatformConfig, WebhooksConfig, parse_config
from oncewire.gateway.platforms.telegram import PollConflict, TelegramBot, WebhookRefused
from oncewire.gateway.platforms.telegram_updates import TelegramInbound, UpdatePoller
from oncewire.gateway.platforms.webhook import SIGNATURE_HEADER, WebhookInbound, sign
from oncewire.gateway.webhooks import (
    TELEGRAM_SECRET_HEADER,
    InboundMessage,
    WebhookServer,
    WebhookServerError,
    telegram_webhook_path,
)
from oncewire.inbound.service import Admission
from tests.conftest import _child_env, wait_for
from tests.support import tables

TOKEN = "123456:fake-SECRET-token"
TG_SECRET = "tg-webhook_Secret-1"
HOOK_SECRET = "hook-hmac-secret"
CHAT = 4242

Rows = list[tuple[Any, ...]]


def config_text(db: str, api_base: str = "http://127.0.0.1:9") -> str:
    return f"""
[store]
db = "{db}"

[[platforms]]
name = "tg"
kind = "telegram"
api_base = "{api_base}"
inbound = "webhook"
webhook_secret_env = "TG_WEBHOOK_SECRET"

[[platforms]]
name = "hook"
kind = "webhook"
send_url = "http://127.0.0.1:9/messages"
secret_env = "HOOK_SECRET"
"""


ENVIRON = {"TG_WEBHOOK_SECRET": TG_SECRET, "HOOK_SECRET": HOOK_SECRET}


def loopback_config(text: str, path: Path) -> GatewayConfig:
    """The config with the server on any free loopback port."""
    config = parse_config(text, path)
    return dataclasses.replace(config, webhooks=WebhooksConfig("127.0.0.1", 0))


class Store:
    """The store admissions commit to, and a plain driver's view of its inbound rows."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.ledger = Ledger(db)

    def rows(self) -> Rows:
        """(platform, chat, platform_message_id, deliveries) of every admitted message."""
        return tables.rows(
            self.db,
            "SELECT platform, chat, platform_message_id, deliveries FROM oncewire_inbound "
            "ORDER BY id",
        )


def _opened(db: str) -> Iterator[Store]:
    store = Store(db)
    try:
        yield store
    finally:
        store.ledger.close()


@pytest.fixture
def any_store(store_url: str) -> Iterator[Store]:
    """The suite's store on each backend."""
    yield from _opened(store_url)


@pytest.fixture
def store(db_path: Path) -> Iterator[Store]:
    """A SQLite store, for what does not depend on the backend."""
    yield from _opened(str(db_path))


class Admitter:
    """The admission callback: ``inbound.admit`` on the store, with a hook run before it and
    one after it (each may raise, as a failing or crashing admission would)."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.admissions: list[Admission] = []
        self.before: Callable[[], None] = lambda: None
        self.after: Callable[[], None] = lambda: None
        self.calls = 0

    def __call__(self, platform: PlatformConfig, message: InboundMessage) -> Admitted:
        self.calls += 1
        self.before()
        if isinstance(message, TelegramInbound):
            admission = self.ledger.inbound.admit(
                platform.name,
                "bot",
                message.chat_id,
                message.message_id,
                {"text": message.text, "update_id": message.update_id},
                thread=message.thread_id,
            )
        else:
            assert isinstance(message, WebhookInbound)
            admission = self.ledger.inbound.admit(
                platform.name,
                "bot",
                message.chat,
                message.message_id,
                {"text": message.text},
                thread=message.thread,
            )
        self.admissions.append(admission)
        self.after()
        return Admitted(admission, "new" if admission.new else "redelivered")


def fail_once(error: str) -> Callable[[], None]:
    failed: list[bool] = []

    def hook() -> None:
        if not failed:
            failed.append(True)
            raise RuntimeError(error)

    return hook


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., tuple[WebhookServer, Admitter]]]:
    """``serve(store, api_base=...)``: a started server admitting into ``store``."""
    servers: list[WebhookServer] = []

    def start(store: Store, api_base: str = "http://127.0.0.1:9") -> tuple[WebhookServer, Admitter]:
        admitter = Admitter(store.ledger)
        config = loopback_config(config_text(store.db, api_base), tmp_path / "gateway.toml")
        server = WebhookServer(config, admitter, environ=ENVIRON)
        server.start()
        servers.append(server)
        return server, admitter

    yield start
    for server in servers:
        server.stop()


class Fake:
    """A fake platform as a real child process: ``python -m MODULE --journal DIR ARGS``."""

    def __init__(
        self, module: str, journal: Path, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.journal = journal
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--port", "0", "--journal", str(journal), *args],
            env=_child_env(**(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("ready port="):
            self.stop()
            raise RuntimeError(f"{module} did not start: {line!r}")
        self.base = f"http://127.0.0.1:{int(line.strip().split('=', 1)[1])}"
        self.control = httpx2.Client(base_url=self.base, timeout=10.0)

    def call(self, action: str, **params: Any) -> dict[str, Any]:
        answer = self.control.post(f"/control/{action}", json=params)
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)
        if hasattr(self, "control"):
            self.control.close()


@pytest.fixture
def fakes(tmp_path: Path) -> Iterator[Callable[..., Fake]]:
    started: list[Fake] = []

    def start(module: str, *args: str, env: dict[str, str] | None = None) -> Fake:
        fake = Fake(module, tmp_path / f"fake{len(started)}", *args, env=env)
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


@pytest.fixture
def telegram(fakes: Callable[..., Fake]) -> Iterator[tuple[Fake, TelegramBot]]:
    """The fake Bot API and an adapter for its bot."""
    fake = fakes("oncewire.testing.telegram_api", "--token", TOKEN, "--name", "fk_tg")
    bot = TelegramBot(TOKEN, api_base=fake.base)
    yield fake, bot
    bot.close()


def deliveries(fake: Fake, update_id: int) -> list[int]:
    """The statuses the fake's webhook deliveries of ``update_id`` were answered with."""
    return [d["status"] for d in fake.call("state")["deliveries"] if d["update_id"] == update_id]


def delivered(fake: Fake, update_id: int) -> bool:
    return any(200 <= status < 300 for status in deliveries(fake, update_id))


# -- Telegram webhook mode, delivered by the fake Bot API --------------------------------------
def test_an_update_first_answered_500_after_its_commit_is_admitted_once(
    any_store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    telegram: tuple[Fake, TelegramBot],
) -> None:
    fake, bot = telegram
    server, admitter = serve(any_store, fake.base)
    # The admission commits, then fails before it returns: a crash after the commit.
    admitter.after = fail_once("lost after the commit")
    bot.set_webhook(server.url + server.paths()["tg"], TG_SECRET)

    update_id = fake.call("inject", chat_id=CHAT, text="hello")["update_id"]
    wait_for(lambda: delivered(fake, update_id), what="a 2xx delivery")

    assert deliveries(fake, update_id) == [500, 200]  # the fake delivered it again
    assert [a.new for a in admitter.admissions] == [True, False]
    assert any_store.rows() == [("tg", str(CHAT), "1000001", 2)]
    assert fake.call("state")["pending_updates"] == []  # confirmed by the 2xx


def test_an_admission_that_raises_answers_500_and_the_fake_delivers_again(
    store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    telegram: tuple[Fake, TelegramBot],
) -> None:
    fake, bot = telegram
    server, admitter = serve(store, fake.base)
    admitter.before = fail_once("the store is busy")
    bot.set_webhook(server.url + server.paths()["tg"], TG_SECRET)

    update_id = fake.call("inject", chat_id=CHAT, text="hello")["update_id"]
    wait_for(lambda: delivered(fake, update_id), what="a 2xx delivery")

    assert deliveries(fake, update_id) == [500, 200]
    assert [a.new for a in admitter.admissions] == [True]
    assert store.rows() == [("tg", str(CHAT), "1000001", 1)]


def test_a_wrong_secret_token_admits_nothing(
    store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    telegram: tuple[Fake, TelegramBot],
) -> None:
    fake, bot = telegram
    server, admitter = serve(store, fake.base)
    bot.set_webhook(server.url + server.paths()["tg"], "not-the-secret")

    update_id = fake.call("inject", chat_id=CHAT, text="hello")["update_id"]
    wait_for(lambda: len(deliveries(fake, update_id)) >= 2, what="a second delivery")
    bot.delete_webhook()

    assert set(deliveries(fake, update_id)) == {401}
    assert admitter.calls == 0
    assert store.rows() == []
    assert fake.call("state")["pending_updates"] == [update_id]  # Telegram keeps it


def test_updates_go_out_in_order_and_polling_is_refused_while_the_webhook_is_set(
    store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    telegram: tuple[Fake, TelegramBot],
) -> None:
    fake, bot = telegram
    server, _ = serve(store, fake.base)
    bot.set_webhook(server.url + server.paths()["tg"], TG_SECRET)
    poller = UpdatePoller(TOKEN, api_base=fake.base, poll_timeout_seconds=0)
    try:
        with pytest.raises(PollConflict, match="webhook is active"):
            poller.poll()
        for text in ("one", "two", "three"):
            fake.call("inject", chat_id=CHAT, text=text)
        wait_for(lambda: len(store.rows()) == 3, what="three admissions")
        assert [r[2] for r in store.rows()] == ["1000001", "1000002", "1000003"]

        bot.delete_webhook()
        update_id = fake.call("inject", chat_id=CHAT, text="polled")["update_id"]
        assert [m.update_id for m in poller.poll()] == [update_id]  # polling works again
    finally:
        poller.close()


def test_the_fake_refuses_a_secret_token_telegram_would_refuse(
    telegram: tuple[Fake, TelegramBot],
) -> None:
    fake, bot = telegram
    with pytest.raises(ValueError, match="1-256 characters"):
        bot.set_webhook("http://127.0.0.1:9/x", "has spaces")
    with pytest.raises(WebhookRefused, match="400"):
        bot.set_webhook("ftp://127.0.0.1/x", TG_SECRET)
    assert fake.call("state")["webhook"] is None


def test_an_update_with_nothing_to_admit_is_answered_200(
    store: Store, serve: Callable[..., tuple[WebhookServer, Admitter]]
) -> None:
    server, admitter = serve(store)
    callback = {"update_id": 7, "callback_query": {"id": "1", "data": "x"}}
    with httpx2.Client(base_url=server.url) as client:
        answer = client.post(
            server.paths()["tg"], json=callback, headers={TELEGRAM_SECRET_HEADER: TG_SECRET}
        )

    assert (answer.status_code, answer.json()) == (
        200,
        {"ok": True, "admitted": False, "reason": "nothing_to_admit"},
    )
    assert admitter.calls == 0


# -- the generic webhook platform, delivered by its fake ---------------------------------------
def test_a_signed_webhook_message_is_admitted(
    store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    fakes: Callable[..., Fake],
) -> None:
    server, _ = serve(store)
    fake = fakes(
        "oncewire.testing.webhook_platform",
        "--secret-env",
        "HOOK_SECRET",
        "--deliver-to",
        server.url + server.paths()["hook"],
        env={"HOOK_SECRET": HOOK_SECRET},
    )
    fake.call("inject", chat="c1", text="hi", message_id="m1")
    wait_for(lambda: fake.call("state")["inbound"][0]["delivered"], what="a 2xx delivery")

    assert fake.call("state")["inbound"] == [{"message_id": "m1", "attempts": 1, "delivered": True}]
    assert store.rows() == [("hook", "c1", "m1", 1)]


def test_a_webhook_message_with_a_bad_signature_admits_nothing(
    store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    fakes: Callable[..., Fake],
) -> None:
    server, admitter = serve(store)
    fake = fakes(
        "oncewire.testing.webhook_platform",
        "--secret-env",
        "HOOK_SECRET",
        "--deliver-to",
        server.url + server.paths()["hook"],
        env={"HOOK_SECRET": "another-secret"},
    )
    fake.call("inject", chat="c1", text="hi", message_id="m1")
    wait_for(lambda: fake.call("state")["inbound"][0]["attempts"] >= 2, what="a re-delivery")

    assert fake.call("state")["inbound"][0]["delivered"] is False
    assert admitter.calls == 0
    assert store.rows() == []


# -- bad requests ------------------------------------------------------------------------------
def test_a_body_over_the_limit_is_413_and_admits_nothing(
    store: Store, serve: Callable[..., tuple[WebhookServer, Admitter]]
) -> None:
    server, admitter = serve(store)
    big = json.dumps({"update_id": 1, "pad": "x" * (1 << 20)}).encode()

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit is counted as it arrives
        yield big[: 1 << 19]
        yield big[1 << 19 :]

    headers = {TELEGRAM_SECRET_HEADER: TG_SECRET}
    with httpx2.Client(base_url=server.url) as client:
        sized = client.post(server.paths()["tg"], content=big, headers=headers)
        streamed = client.post(server.paths()["tg"], content=chunked(), headers=headers)
        signed = {SIGNATURE_HEADER: sign(HOOK_SECRET, big)}
        hook = client.post(server.paths()["hook"], content=big, headers=signed)

    assert [sized.status_code, streamed.status_code, hook.status_code] == [413, 413, 413]
    assert sized.json() == {"ok": False, "error": "the body is over 1048576 bytes"}
    assert admitter.calls == 0
    assert store.rows() == []


@pytest.mark.parametrize(
    ("route", "body", "error"),
    [
        ("tg", b"{not json", "the body is not JSON"),
        ("tg", b"[1, 2]", "the body is not a JSON object"),
        ("hook", b"{not json", "the body is not JSON"),
        ("hook", b'{"chat": "c1", "text": "hi"}', "message_id must be a string or an integer"),
        ("hook", b'{"message_id": "", "chat": "c1", "text": "x"}', "must not be empty"),
    ],
)
def test_a_body_that_is_no_message_is_400_and_admits_nothing(
    store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    route: str,
    body: bytes,
    error: str,
) -> None:
    server, admitter = serve(store)
    headers = (
        {TELEGRAM_SECRET_HEADER: TG_SECRET}
        if route == "tg"
        else {SIGNATURE_HEADER: sign(HOOK_SECRET, body)}
    )
    with httpx2.Client(base_url=server.url) as client:
        answer = client.post(server.paths()[route], content=body, headers=headers)

    assert answer.status_code == 400
    assert error in answer.json()["error"]
    assert "Traceback" not in answer.text
    assert admitter.calls == 0


def test_health_unknown_routes_and_a_missing_secret_header(
    store: Store, serve: Callable[..., tuple[WebhookServer, Admitter]]
) -> None:
    server, admitter = serve(store)
    update = {"update_id": 1, "message": {"message_id": 1, "chat": {"id": 1}, "text": "x"}}
    with httpx2.Client(base_url=server.url) as client:
        health = client.get("/healthz")
        unknown = client.post("/telegram/tg/guessed", json=update)
        no_header = client.post(server.paths()["tg"], json=update)
        wrong = client.get(server.paths()["tg"])

    assert (health.status_code, health.json()) == (200, {"ok": True})
    assert unknown.status_code == 404
    assert no_header.status_code == 401
    assert wrong.status_code == 405
    assert admitter.calls == 0


# -- routes, configuration, lifecycle ----------------------------------------------------------
def test_the_telegram_path_comes_from_the_secret_and_never_holds_the_token(
    store: Store, serve: Callable[..., tuple[WebhookServer, Admitter]]
) -> None:
    server, _ = serve(store)
    path = server.paths()["tg"]

    assert path == telegram_webhook_path("tg", TG_SECRET)
    assert path.startswith("/telegram/tg/") and len(path.rsplit("/", 1)[1]) == 32
    assert telegram_webhook_path("tg", "another") != path
    assert TOKEN not in path and TG_SECRET not in path
    assert server.paths()["hook"] == "/webhook/hook"


def test_a_missing_secret_or_a_webhook_platform_without_one_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    config = loopback_config(config_text(str(tmp_path / "g.db")), tmp_path / "gateway.toml")
    with pytest.raises(ConfigurationError, match="TG_WEBHOOK_SECRET is not set"):
        WebhookServer(config, lambda p, m: None, environ={"HOOK_SECRET": HOOK_SECRET})

    unsigned = config_text(str(tmp_path / "g.db")).replace('secret_env = "HOOK_SECRET"\n', "")
    config = loopback_config(unsigned, tmp_path / "gateway.toml")
    with pytest.raises(ConfigurationError, match="platform hook: its inbound route needs"):
        WebhookServer(config, lambda p, m: None, environ=ENVIRON)


def test_the_bind_defaults_to_loopback_and_a_taken_port_is_refused(tmp_path: Path) -> None:
    config = parse_config(config_text(str(tmp_path / "g.db")), tmp_path / "gateway.toml")
    assert (config.webhooks.host, config.webhooks.port) == ("127.0.0.1", 8443)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = dataclasses.replace(config, webhooks=WebhooksConfig("127.0.0.1", port))
        server = WebhookServer(busy, lambda p, m: None, environ=ENVIRON)
        with pytest.raises(WebhookServerError, match=r"cannot listen on http://127\.0\.0\.1"):
            server.start()


def test_stop_answers_the_admission_in_progress_then_refuses_connections(
    store: Store, serve: Callable[..., tuple[WebhookServer, Admitter]]
) -> None:
    server, admitter = serve(store)
    entered, release = threading.Event(), threading.Event()

    def block() -> None:
        entered.set()
        assert release.wait(20)

    admitter.before = block
    update = {"update_id": 3, "message": {"message_id": 9, "chat": {"id": 5}, "text": "x"}}
    answers: list[int] = []

    def post() -> None:
        with httpx2.Client(base_url=server.url, timeout=20) as client:
            headers = {TELEGRAM_SECRET_HEADER: TG_SECRET}
            answers.append(
                client.post(server.paths()["tg"], json=update, headers=headers).status_code
            )

    poster = threading.Thread(target=post)
    poster.start()
    assert entered.wait(20)
    stopper = threading.Thread(target=server.stop)
    stopper.start()
    wait_for(lambda: _refused(server.port), what="the listener to close")
    assert stopper.is_alive()  # still draining
    release.set()
    stopper.join(20)
    poster.join(20)

    assert answers == [200]
    assert store.rows() == [("tg", "5", "9", 1)]
    assert _refused(server.port)


def _refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_webhook_mode_has_a_secret_variable_by_default_and_polling_none(tmp_path: Path) -> None:
    text = config_text(str(tmp_path / "g.db")).replace(
        'webhook_secret_env = "TG_WEBHOOK_SECRET"\n', ""
    )
    webhook_mode = parse_config(text, tmp_path / "gateway.toml").platforms[0]
    polling = parse_config(
        text.replace('inbound = "webhook"', 'inbound = "polling"'), tmp_path / "gateway.toml"
    ).platforms[0]

    assert webhook_mode.webhook_secret_env == "TELEGRAM_WEBHOOK_SECRET"
    assert polling.webhook_secret_env is None
    with pytest.raises(ConfigurationError, match="webhook_secret_env: must name an environment"):
        parse_config(
            text.replace('inbound = "webhook"', 'inbound = "webhook"\nwebhook_secret_env = "a b"'),
            tmp_path / "gateway.toml",
        )


def test_gateway_check_looks_for_the_webhook_secret(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    text = config_text(str(tmp_path / "g.db")) + '[model]\nbase_url = "http://127.0.0.1:9/v1"\n'
    path.write_text(text, encoding="utf-8")

    _, results = check_config(path, {"TELEGRAM_BOT_TOKEN": TOKEN, "HOOK_SECRET": HOOK_SECRET})

    (secret,) = [r for r in results if r.name == "env TG_WEBHOOK_SECRET"]
    assert secret.failed
    assert secret.detail == "not set (needed by platform tg webhook_secret_env)"


def test_a_platform_name_that_needs_quoting_is_served_at_its_quoted_path(
    store: Store, tmp_path: Path
) -> None:
    text = config_text(store.db).replace('name = "hook"', 'name = "hook one/two"')
    admitter = Admitter(store.ledger)
    server = WebhookServer(loopback_config(text, tmp_path / "g.toml"), admitter, environ=ENVIRON)
    body = b'{"message_id": "m1", "chat": "c1", "text": "hi"}'
    with server, httpx2.Client(base_url=server.url) as client:
        path = server.paths()["hook one/two"]
        answer = client.post(
            path, content=body, headers={SIGNATURE_HEADER: sign(HOOK_SECRET, body)}
        )

    assert path == "/webhook/hook%20one%2Ftwo"
    assert answer.status_code == 200, answer.text
    assert store.rows() == [("hook one/two", "c1", "m1", 1)]


def test_a_restarted_fake_goes_on_delivering_to_the_webhook(
    store: Store,
    serve: Callable[..., tuple[WebhookServer, Admitter]],
    telegram: tuple[Fake, TelegramBot],
) -> None:
    fake, bot = telegram
    server, _ = serve(store, fake.base)
    bot.set_webhook(server.url + server.paths()["tg"], TG_SECRET)
    fake.stop()

    again = Fake("oncewire.testing.telegram_api", fake.journal, "--token", TOKEN, "--name", "fk_tg")
    try:
        update_id = again.call("inject", chat_id=CHAT, text="after the restart")["update_id"]
        wait_for(lambda: delivered(again, update_id), what="a 2xx delivery")
    finally:
        again.stop()

    assert store.rows() == [("tg", str(CHAT), "1000001", 1)]
