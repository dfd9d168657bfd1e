"""``oncewire gateway webhook set|delete`` as a real process against the fake Bot API (a child
process too): what Telegram was told is read from the fake's own state."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire.gateway.webhooks import telegram_webhook_path
from tests.conftest import _child_env
from tests.gateway.test_webhooks import TOKEN, Fake

SECRET = "cli-webhook-secret"
ENV = {"TG_TOKEN": TOKEN, "TG_WEBHOOK_SECRET": SECRET, "POLL_TOKEN": TOKEN}


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    started = Fake("oncewire.testing.telegram_api", tmp_path / "tg", "--token", TOKEN)
    yield started
    started.stop()


def write_config(tmp_path: Path, api_base: str, *, second_webhook: bool = False) -> Path:
    extra = (
        f"""
[[platforms]]
name = "tg2"
kind = "telegram"
token_env = "TG_TOKEN"
api_base = "{api_base}"
inbound = "webhook"
webhook_secret_env = "TG_WEBHOOK_SECRET"
"""
        if second_webhook
        else ""
    )
    path = tmp_path / "gateway.toml"
    path.write_text(
        f"""
[[platforms]]
name = "tg"
kind = "telegram"
token_env = "TG_TOKEN"
api_base = "{api_base}"
inbound = "webhook"
webhook_secret_env = "TG_WEBHOOK_SECRET"

[[platforms]]
name = "poll"
kind = "telegram"
token_env = "POLL_TOKEN"
api_base = "{api_base}"
{extra}
[webhooks]
bind = "127.0.0.1:8443"
""",
        encoding="utf-8",
    )
    return path


def webhook(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    ran = subprocess.run(
        [sys.executable, "-m", "oncewire", "gateway", "webhook", *args],
        env=_child_env(**(ENV if env is None else env)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert TOKEN not in ran.stdout + ran.stderr
    return ran


def test_set_registers_the_route_with_its_secret_and_delete_removes_it(
    fake: Fake, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake.base)

    ran = webhook("set", "--config", str(config), "--url", "https://bot.example.org/")

    url = "https://bot.example.org" + telegram_webhook_path("tg", SECRET)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == f"webhook set: Telegram now POSTs tg's updates to {url}\n"
    assert fake.call("state")["webhook"] == url
    (call,) = [c for c in fake_calls(fake) if c["method"] == "setWebhook"]
    assert call["params"]["secret_token"] == SECRET
    assert call["params"]["allowed_updates"] == ["message", "edited_message"]

    ran = webhook("delete", "--config", str(config), "--platform", "tg")

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "webhook deleted: tg can be long-polled\n"
    assert fake.call("state")["webhook"] is None


def test_without_a_url_the_bind_address_is_used(fake: Fake, tmp_path: Path) -> None:
    config = write_config(tmp_path, fake.base)

    ran = webhook("set", "--config", str(config), "--platform", "tg")

    assert ran.returncode == 0, ran.stderr
    assert fake.call("state")["webhook"] == "http://127.0.0.1:8443" + telegram_webhook_path(
        "tg", SECRET
    )


def test_usage_problems_exit_2_and_call_nothing(fake: Fake, tmp_path: Path) -> None:
    config = write_config(tmp_path, fake.base, second_webhook=True)

    several = webhook("set", "--config", str(config))
    polling = webhook("set", "--config", str(config), "--platform", "poll")
    unknown = webhook("delete", "--config", str(config), "--platform", "nope")
    no_secret = webhook("set", "--config", str(config), "--platform", "tg", env={"TG_TOKEN": TOKEN})

    assert several.returncode == 2 and "name one with --platform (tg, tg2)" in several.stderr
    assert polling.returncode == 2 and 'platform poll has inbound = "polling"' in polling.stderr
    assert unknown.returncode == 2 and "no Telegram platform named 'nope'" in unknown.stderr
    assert no_secret.returncode == 2
    assert "TG_WEBHOOK_SECRET is not set" in no_secret.stderr
    assert fake_calls(fake) == []


def test_a_refused_token_exits_1(fake: Fake, tmp_path: Path) -> None:
    config = write_config(tmp_path, fake.base)

    ran = webhook(
        "set",
        "--config",
        str(config),
        "--platform",
        "tg",
        env={**ENV, "TG_TOKEN": "999:another-token"},
    )

    assert ran.returncode == 1
    assert "tg: setWebhook: 401 Unauthorized [telegram_unauthorized]" in ran.stderr
    assert "another-token" not in ran.stderr
    assert fake.call("state")["webhook"] is None


def fake_calls(fake: Fake) -> list[dict[str, Any]]:
    """The Bot API calls the fake answered."""
    path = fake.journal / "calls.jsonl"
    if not path.exists():
        return []
    calls = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [c for c in calls if "method" in c]
