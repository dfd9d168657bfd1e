"""gateway.toml: the keys of the documented example, defaults, and a clear refusal for every bad
value (naming the file and the key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.gateway.config import RESUME_NOTE, GatewayConfig, load_config, parse_config

FULL = """
[store]
db = "gateway.db"

[model]
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"
model = "gpt-4.1-mini"
connect_timeout = 5
read_timeout = 120
max_retries = 2
system_prompt_file = "system.md"

[turns]
busy_mode = "interrupt"
max_concurrent = 8
max_steps = 16
max_starts = 3
resume_note = "Note: resumed."
history_messages = 12
history_chars = 8000

[[platforms]]
name = "tg"
kind = "telegram"
token_env = "TELEGRAM_BOT_TOKEN"
api_base = "https://api.telegram.org"
inbound = "polling"
streaming = true
edit_interval_seconds = 1.0
allowed_users = [123456789]

[[platforms]]
name = "dc"
kind = "discord"
token_env = "DISCORD_BOT_TOKEN"
api_base = "https://discord.com/api/v10"
streaming = true

[[platforms]]
name = "hook"
kind = "webhook"
send_url = "https://example.internal/messages"
secret_env = "HOOK_SECRET"
streaming = false

[[tools]]
name = "create_ticket"
sink = "myapp.tools:create_ticket"
schema_file = "tools/create_ticket.json"
side_effect = "external"
timeout_seconds = 30

[webhooks]
bind = "127.0.0.1:8443"
"""

MINIMAL = """
[[platforms]]
name = "tg"
kind = "telegram"
"""

CONFIG = Path("/etc/oncewire/gateway.toml")


def parse(text: str) -> GatewayConfig:
    return parse_config(text, CONFIG)


def refusal(text: str) -> str:
    with pytest.raises(ConfigurationError) as caught:
        parse(text)
    message = str(caught.value)
    assert message.startswith(f"{CONFIG}: "), message
    return message


def test_the_documented_example_reads_into_typed_values() -> None:
    config = parse(FULL)

    assert config.store.db == "/etc/oncewire/gateway.db"
    assert config.model.base_url == "https://api.openai.com/v1"
    assert config.model.api_key_env == "OPENAI_API_KEY"
    assert (config.model.connect_timeout_seconds, config.model.read_timeout_seconds) == (5.0, 120.0)
    assert config.model.system_prompt_file == Path("/etc/oncewire/system.md")
    assert (config.turns.busy_mode, config.turns.max_starts) == ("interrupt", 3)
    assert config.turns.resume_note == "Note: resumed."
    assert (config.turns.history_messages, config.turns.history_chars) == (12, 8000)
    tg, dc, hook = config.platforms
    assert (tg.kind, tg.inbound, tg.allowed_users, tg.token_env) == (
        "telegram",
        "polling",
        (123456789,),
        "TELEGRAM_BOT_TOKEN",
    )
    assert (dc.kind, dc.api_base, dc.streaming) == ("discord", "https://discord.com/api/v10", True)
    assert (hook.kind, hook.send_url, hook.secret_env, hook.streaming) == (
        "webhook",
        "https://example.internal/messages",
        "HOOK_SECRET",
        False,
    )
    (tool,) = config.tools
    assert (tool.sink, tool.side_effect, tool.timeout_seconds) == (
        "myapp.tools:create_ticket",
        "external",
        30.0,
    )
    assert tool.schema_file == Path("/etc/oncewire/tools/create_ticket.json")
    assert (config.webhooks.host, config.webhooks.port) == ("127.0.0.1", 8443)


def test_every_omitted_key_takes_its_documented_default() -> None:
    config = parse(MINIMAL)

    assert config.store.db == "/etc/oncewire/gateway.db"
    assert config.model.model == "gpt-4.1-mini"
    assert config.model.api_key_env == "OPENAI_API_KEY"
    assert config.model.max_retries == 2
    assert config.model.system_prompt_file is None
    assert (config.turns.busy_mode, config.turns.max_concurrent, config.turns.max_steps) == (
        "interrupt",
        8,
        16,
    )
    assert config.turns.resume_note == RESUME_NOTE
    assert (config.turns.history_messages, config.turns.history_chars) == (20, 24_000)
    (tg,) = config.platforms
    assert (tg.api_base, tg.inbound, tg.streaming, tg.edit_interval_seconds) == (
        "https://api.telegram.org",
        "polling",
        True,
        1.0,
    )
    assert tg.read_timeout_seconds == 10.0
    assert config.tools == ()
    assert (config.webhooks.host, config.webhooks.port) == ("127.0.0.1", 8443)


def test_a_postgresql_url_is_kept_as_is() -> None:
    config = parse('[store]\ndb = "postgresql://127.0.0.1/test"\n' + MINIMAL)

    assert config.store.db == "postgresql://127.0.0.1/test"


def test_an_empty_api_key_env_means_a_model_server_without_a_key() -> None:
    assert parse('[model]\napi_key_env = ""\n' + MINIMAL).model.api_key_env is None


def test_unknown_keys_are_refused_with_the_closest_known_one() -> None:
    message = refusal("[model]\nread_timout = 5\n" + MINIMAL)
    assert "[model] read_timout: unknown key; did you mean 'read_timeout'?" in message

    message = refusal(MINIMAL + "streming = true\n")
    assert "[[platforms]] #1 streming: unknown key; did you mean 'streaming'?" in message

    assert "unknown key (known: " in refusal("[sessions]\nx = 1\n" + MINIMAL)


def test_a_literal_secret_in_the_file_is_refused_without_repeating_it() -> None:
    token = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"

    message = refusal(MINIMAL + f'token = "{token}"\n')
    assert "token_env" in message and "environment variable" in message
    assert token not in message

    message = refusal(
        MINIMAL.replace('kind = "telegram"', f'kind = "telegram"\ntoken_env = "{token}"')
    )
    assert "token_env: must name an environment variable" in message
    assert token not in message

    assert "api_key_env" in refusal('[model]\napi_key = "sk-abc"\n' + MINIMAL)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[model]\nread_timeout = 0\n", "[model] read_timeout: must be a number of seconds > 0"),
        ("[model]\nread_timeout = nan\n", "[model] read_timeout: must be a number of seconds > 0"),
        ('[model]\nconnect_timeout = "5"\n', "[model] connect_timeout: must be a number"),
        ("[model]\nmax_retries = -1\n", "[model] max_retries: must be an integer >= 0"),
        ("[model]\nmax_retries = true\n", "[model] max_retries: must be an integer >= 0"),
        ('[model]\nbase_url = "api.openai.com"\n', "[model] base_url: must be an http"),
        ('[model]\nmodel = ""\n', "[model] model: must be a non-empty string"),
        ('[turns]\nbusy_mode = "drop"\n', "[turns] busy_mode: must be one of interrupt, queue"),
        ("[turns]\nmax_concurrent = 0\n", "[turns] max_concurrent: must be an integer >= 1"),
        ('[store]\ndb = "mysql://x"\n', "[store] db: must be a SQLite file path or a postgresql"),
        ('[webhooks]\nbind = "8443"\n', "[webhooks] bind: must be HOST:PORT"),
        ('[webhooks]\nbind = "0.0.0.0:70000"\n', "[webhooks] bind: must be HOST:PORT"),
        ("model = 3\n", "model: must be a table [model]"),
    ],
)
def test_bad_values_name_the_key(text: str, expected: str) -> None:
    assert expected in refusal(text + MINIMAL)


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ('kind = "telegram"', "[[platforms]] #1 name: is required"),
        ('name = "x"', "[[platforms]] #1 kind: is required"),
        ('name = "x"\nkind = "slack"', "kind: must be one of telegram, discord, webhook"),
        ('name = "x"\nkind = "telegram"\ninbound = "push"', "inbound: must be one of polling"),
        ('name = "x"\nkind = "telegram"\nstreaming = 1', "streaming: must be true or false"),
        ('name = "x"\nkind = "telegram"\nallowed_users = ["bob"]', "allowed_users: must be a list"),
        ('name = "x"\nkind = "discord"\ninbound = "polling"', "inbound: unknown key"),
        ('name = "x"\nkind = "webhook"', "#1 send_url: is required"),
        (
            'name = "x"\nkind = "telegram"\nread_timeout_seconds = 0',
            "read_timeout_seconds: must be a number of seconds > 0",
        ),
        (
            'name = "x"\nkind = "webhook"\nsend_url = "https://h/m"\nstreaming = true',
            "a webhook platform cannot edit messages",
        ),
    ],
)
def test_bad_platforms_name_the_entry_and_key(platform: str, expected: str) -> None:
    assert expected in refusal(f"[[platforms]]\n{platform}\n")


def test_platforms_and_tools_are_checked_as_a_whole() -> None:
    assert "platforms: at least one [[platforms]] is needed" in refusal("[model]\n")
    assert "platforms: the name 'tg' is used twice" in refusal(MINIMAL + MINIMAL)
    tool = '[[tools]]\nname = "t"\nsink = "m:f"\n'
    assert "tools: the name 't' is used twice" in refusal(MINIMAL + tool + tool)


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ('name = "t"\nsink = "myapp.tools"', "sink: must be module:callable"),
        ('name = "t"\nsink = "m:f"\nside_effect = "harmless"', "side_effect: must be one of"),
        ('name = "t"\nsink = "m:f"\ntimeout_seconds = -1', "timeout_seconds: must be a number"),
        ('sink = "m:f"', "[[tools]] #1 name: is required"),
    ],
)
def test_bad_tools_name_the_entry_and_key(tool: str, expected: str) -> None:
    assert expected in refusal(MINIMAL + f"[[tools]]\n{tool}\n")


def test_invalid_toml_names_the_file_and_the_line() -> None:
    assert "not valid TOML" in refusal("[model\n")


def test_a_secret_is_read_from_the_named_variable(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(MINIMAL, encoding="utf-8")
    config = load_config(path)

    assert config.secret("TELEGRAM_BOT_TOKEN", {"TELEGRAM_BOT_TOKEN": "t-1"}) == "t-1"
    with pytest.raises(ConfigurationError, match="TELEGRAM_BOT_TOKEN is not set"):
        config.secret("TELEGRAM_BOT_TOKEN", {})


def test_a_missing_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_config(tmp_path / "absent.toml")
