"""``oncewire gateway check`` as a real child process against the fakes as real child processes
(the Bot API with a good and a bad token, the model server, the webhook platform, Discord), a
closed port for what is unreachable, a SQLite file and a PostgreSQL store. No secret's value may
appear in what it prints, whatever fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire.gateway.http import Timeouts
from oncewire.gateway.model import (
    ModelBroken,
    ModelNotSent,
    ModelRejected,
    OpenAIChatClient,
)
from oncewire.ledger import Ledger
from tests.conftest import _child_env
from tests.gateway.conftest import Answering, FakeOpenAI, spawn_fake, stop_process
from tests.gateway.test_telegram_wire import TOKEN, FakeTelegram
from tests.support.pg import fresh_schema, server_url

BIN = Path(sys.executable).parent
ONCEWIRE = shutil.which("oncewire", path=str(BIN)) or shutil.which("oncewire")

MODEL_KEY = "sk-model-SECRET-4711"
BAD_TOKEN = "999999:wrong-SECRET-token"
HOOK_SECRET = "hook-SECRET-0815"
SECRETS = (MODEL_KEY, TOKEN, BAD_TOKEN, HOOK_SECRET)
# Every variable a config below names: unset unless a test sets it.
SECRET_VARS = ("MODEL_KEY", "TG_TOKEN", "TG_BAD_TOKEN", "HOOK_SECRET")
ALL_SET = {
    "MODEL_KEY": MODEL_KEY,
    "TG_TOKEN": TOKEN,
    "TG_BAD_TOKEN": BAD_TOKEN,
    "HOOK_SECRET": HOOK_SECRET,
}


class FakeWebhookPlatform:
    """A running ``python -m oncewire.testing.webhook_platform`` (only its port is used)."""

    def __init__(self, directory: Path) -> None:
        self.process, port = spawn_fake(
            "oncewire.testing.webhook_platform", ["--port", "0", "--journal", str(directory)]
        )
        self.send_url = f"http://127.0.0.1:{port}/messages"

    def stop(self) -> None:
        stop_process(self.process)


class FakeDiscord:
    """A running ``python -m oncewire.testing.discord_api`` accepting ``TOKEN``."""

    def __init__(self, directory: Path) -> None:
        self.process, port = spawn_fake(
            "oncewire.testing.discord_api",
            ["--port", "0", "--journal", str(directory), "--token", TOKEN],
        )
        self.api_base = f"http://127.0.0.1:{port}/api/v10"

    def stop(self) -> None:
        stop_process(self.process)


class Fakes:
    def __init__(self, directory: Path) -> None:
        self.telegram = FakeTelegram(directory / "telegram")
        self.model = FakeOpenAI(directory / "model", [])
        self.webhook = FakeWebhookPlatform(directory / "webhook")
        self.discord = FakeDiscord(directory / "discord")

    def stop(self) -> None:
        for fake in (self.telegram, self.model, self.webhook, self.discord):
            fake.stop()


@pytest.fixture(scope="module")
def fakes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fakes]:
    started = Fakes(tmp_path_factory.mktemp("fakes"))
    yield started
    started.stop()


def write_config(
    directory: Path,
    *,
    db: str,
    model_url: str,
    platforms: list[str],
    model: str = "fake-model",
) -> Path:
    text = f"""
[store]
db = "{db}"

[model]
base_url = "{model_url}"
api_key_env = "MODEL_KEY"
model = "{model}"
connect_timeout = 2
read_timeout = 5
"""
    path = directory / "gateway.toml"
    path.write_text(text + "".join(platforms), encoding="utf-8")
    return path


def telegram(name: str, api_base: str, token_env: str = "TG_TOKEN") -> str:
    return f"""
[[platforms]]
name = "{name}"
kind = "telegram"
token_env = "{token_env}"
api_base = "{api_base}"
"""


def webhook(name: str, send_url: str) -> str:
    return f"""
[[platforms]]
name = "{name}"
kind = "webhook"
send_url = "{send_url}"
secret_env = "HOOK_SECRET"
"""


def discord(name: str, api_base: str, token_env: str = "TG_TOKEN") -> str:
    return f"""
[[platforms]]
name = "{name}"
kind = "discord"
token_env = "{token_env}"
api_base = "{api_base}"
"""


def check(
    config: Path, env: dict[str, str], *extra: str, as_json: bool = True
) -> tuple[int, Any, str]:
    """(exit code, the JSON or text printed, stderr) of ``oncewire gateway check``."""
    assert ONCEWIRE, "the oncewire console script is not installed next to this Python"
    environment = {k: v for k, v in _child_env().items() if k not in SECRET_VARS}
    ran = subprocess.run(
        [ONCEWIRE, "gateway", "check", "--config", str(config), *extra]
        + (["--json"] if as_json else []),
        env={**environment, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    for secret in SECRETS:
        assert secret not in ran.stdout + ran.stderr
    out = json.loads(ran.stdout) if as_json and ran.stdout else ran.stdout
    return ran.returncode, out, ran.stderr


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def sqlite_store(tmp_path: Path) -> str:
    db = tmp_path / "gateway.db"
    Ledger(str(db)).close()
    return str(db)


# -- everything there ------------------------------------------------------------------------
def test_every_check_passes_against_the_fakes_and_a_sqlite_store(
    fakes: Fakes, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path,
        db=sqlite_store(tmp_path),
        model_url=fakes.model.base_url,
        platforms=[
            telegram("tg", fakes.telegram.base),
            webhook("hook", fakes.webhook.send_url),
            discord("dc", fakes.discord.api_base),
        ],
    )

    code, report, stderr = check(config, ALL_SET)

    assert (code, stderr, report["ok"]) == (0, "", True)
    checks = by_name(report)
    assert list(checks) == [
        "config",
        "env MODEL_KEY",
        "env TG_TOKEN",
        "env HOOK_SECRET",
        "store",
        "model",
        "platform tg",
        "platform hook",
        "platform dc",
    ]
    assert {c["status"] for c in checks.values()} == {"ok"}
    assert "platform tg token_env, platform dc token_env" in checks["env TG_TOKEN"]["detail"]
    assert checks["store"]["detail"].startswith(f"SQLite store at {tmp_path / 'gateway.db'}")
    assert "lists fake-model" in checks["model"]["detail"]
    assert checks["platform tg"]["detail"] == "telegram bot @oncewire_fake_bot (id 7000001)"
    assert checks["platform dc"]["detail"] == "discord bot oncewire-fake (id 900000000000000001)"
    # The model server was asked once, with the key from the environment.
    [asked] = [r for r in fakes.model.requests() if r["path"].startswith("/v1/models")]
    assert asked["authorization"] == f"Bearer {MODEL_KEY}"


def test_the_text_report_is_one_line_per_check(fakes: Fakes, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        db=sqlite_store(tmp_path),
        model_url=fakes.model.base_url,
        platforms=[telegram("tg", fakes.telegram.base)],
    )

    code, text, stderr = check(config, ALL_SET, as_json=False)

    assert (code, stderr) == (0, "")
    lines = text.splitlines()
    assert [line.split()[:3] for line in lines] == [
        ["ok", "config", str(config) + ":"],
        ["ok", "env", "MODEL_KEY"],
        ["ok", "env", "TG_TOKEN"],
        ["ok", "store", "SQLite"],
        ["ok", "model", fakes.model.base_url],
        ["ok", "platform", "tg"],
    ]


def test_a_fresh_sqlite_path_would_be_created_and_is_not(fakes: Fakes, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        db="new/gateway.db",
        model_url=fakes.model.base_url,
        platforms=[telegram("tg", fakes.telegram.base)],
    )
    (tmp_path / "new").mkdir()

    code, report, _ = check(config, ALL_SET)

    assert code == 0
    store = by_name(report)["store"]
    assert store["status"] == "ok"
    assert (
        store["detail"]
        == f"no store at {tmp_path / 'new/gateway.db'} yet: the gateway will create it"
    )
    assert list((tmp_path / "new").iterdir()) == []


def test_a_store_in_a_missing_directory_fails(fakes: Fakes, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        db="nowhere/gateway.db",
        model_url=fakes.model.base_url,
        platforms=[telegram("tg", fakes.telegram.base)],
    )

    code, report, _ = check(config, ALL_SET)

    assert (code, report["ok"]) == (1, False)
    store = by_name(report)["store"]
    assert (store["status"], store["problem"]) == ("failed", "unusable")
    assert not (tmp_path / "nowhere").exists()


def test_a_file_that_is_not_a_store_fails_and_is_left_as_it_was(
    fakes: Fakes, tmp_path: Path
) -> None:
    (tmp_path / "notes.db").write_text("not a database", encoding="utf-8")
    config = write_config(
        tmp_path,
        db="notes.db",
        model_url=fakes.model.base_url,
        platforms=[telegram("tg", fakes.telegram.base)],
    )

    code, report, _ = check(config, ALL_SET)

    assert code == 1
    assert by_name(report)["store"]["problem"] == "unusable"
    assert (tmp_path / "notes.db").read_text(encoding="utf-8") == "not a database"


def test_a_postgresql_store_opens(fakes: Fakes, tmp_path: Path) -> None:
    with fresh_schema(server_url(), "gwcheck") as url:
        Ledger(url).close()  # the gateway made it once
        config = write_config(
            tmp_path,
            db=url,
            model_url=fakes.model.base_url,
            platforms=[telegram("tg", fakes.telegram.base)],
        )

        code, report, _ = check(config, ALL_SET)

    assert code == 0, report
    assert by_name(report)["store"]["detail"].startswith("PostgreSQL store at postgresql://")


def test_a_postgresql_database_without_oncewire_schema_fails_unchanged(
    fakes: Fakes, tmp_path: Path
) -> None:
    import psycopg

    with fresh_schema(server_url(), "gwempty") as url:
        config = write_config(
            tmp_path,
            db=url,
            model_url=fakes.model.base_url,
            platforms=[telegram("tg", fakes.telegram.base)],
        )

        code, report, _ = check(config, ALL_SET)

        with psycopg.connect(url, autocommit=True) as conn:  # url's search_path: the schema
            tables = conn.execute(
                "SELECT count(*) FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            ).fetchone()
    assert code == 1
    store = by_name(report)["store"]
    assert (store["status"], store["problem"]) == ("failed", "unusable")
    assert "no oncewire schema" in store["detail"]
    assert tables == (0,)  # the check created nothing


# -- failures, each named --------------------------------------------------------------------
def test_a_refused_token_is_unauthorized_and_never_printed(fakes: Fakes, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        db=sqlite_store(tmp_path),
        model_url=fakes.model.base_url,
        platforms=[
            telegram("good", fakes.telegram.base),
            telegram("bad", fakes.telegram.base, token_env="TG_BAD_TOKEN"),
            discord("dcbad", fakes.discord.api_base, token_env="TG_BAD_TOKEN"),
        ],
    )

    code, report, _ = check(config, ALL_SET)

    assert (code, report["ok"]) == (1, False)
    checks = by_name(report)
    assert checks["platform good"]["status"] == "ok"
    bad = checks["platform bad"]
    assert (bad["status"], bad["problem"]) == ("failed", "unauthorized")
    assert "TG_BAD_TOKEN" in bad["detail"]
    dc = checks["platform dcbad"]
    assert (dc["status"], dc["problem"]) == ("failed", "unauthorized")


def test_what_cannot_be_reached_is_unreachable(
    fakes: Fakes, tmp_path: Path, closed_port: int
) -> None:
    closed = f"http://127.0.0.1:{closed_port}"
    config = write_config(
        tmp_path,
        db=sqlite_store(tmp_path),
        model_url=f"{closed}/v1",
        platforms=[
            telegram("tg", closed),
            webhook("hook", f"{closed}/messages"),
            discord("dc", f"{closed}/api/v10"),
        ],
    )

    code, report, _ = check(config, ALL_SET)

    assert code == 1
    checks = by_name(report)
    for name in ("model", "platform tg", "platform hook", "platform dc"):
        assert (checks[name]["status"], checks[name]["problem"]) == ("failed", "unreachable")
    assert checks["store"]["status"] == "ok"


def test_a_model_the_server_does_not_list_fails(fakes: Fakes, tmp_path: Path) -> None:
    config = write_config(
        tmp_path,
        db=sqlite_store(tmp_path),
        model_url=fakes.model.base_url,
        platforms=[telegram("tg", fakes.telegram.base)],
        model="gpt-nope",
    )

    code, report, _ = check(config, ALL_SET)

    assert code == 1
    model = by_name(report)["model"]
    assert model["problem"] == "not_listed"
    assert model["detail"].endswith("does not list gpt-nope; it lists: fake-model")


def test_unset_secrets_are_named_and_nothing_is_asked_without_them(
    fakes: Fakes, tmp_path: Path
) -> None:
    config = write_config(
        tmp_path,
        db=sqlite_store(tmp_path),
        model_url=fakes.model.base_url,
        platforms=[telegram("tg", fakes.telegram.base), webhook("hook", fakes.webhook.send_url)],
    )
    asked_before = len(fakes.model.requests())

    code, report, _ = check(config, {"HOOK_SECRET": HOOK_SECRET})

    assert code == 1
    checks = by_name(report)
    for name in ("env MODEL_KEY", "env TG_TOKEN", "model", "platform tg"):
        assert (checks[name]["status"], checks[name]["problem"]) == ("failed", "not_set"), name
    assert checks["env HOOK_SECRET"]["status"] == "ok"
    assert len(fakes.model.requests()) == asked_before


# -- a config that does not load -------------------------------------------------------------
def test_a_bad_config_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[model]\nread_timout = 5\n[[platforms]]\nname="t"\nkind="telegram"\n')

    code, text, stderr = check(config, {}, as_json=False)

    assert (code, text) == (2, "")
    assert stderr.splitlines() == [
        f"error: {config}: [model] read_timout: unknown key; did you mean 'read_timeout'? "
        "[configuration_error]"
    ]


def test_a_bad_config_in_json_is_the_config_check_failed(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(f'[[platforms]]\nname = "t"\nkind = "telegram"\ntoken = "{TOKEN}"\n')

    code, report, stderr = check(config, {})

    assert (code, stderr, report["ok"]) == (2, "", False)
    [failed] = report["checks"]
    assert (failed["name"], failed["status"], failed["problem"]) == ("config", "failed", "invalid")
    assert "secrets are never written in the config file" in failed["detail"]


def test_a_missing_config_file_is_exit_2(tmp_path: Path) -> None:
    code, _, stderr = check(tmp_path / "absent.toml", {}, as_json=False)

    assert code == 2
    assert stderr.startswith("error: ") and "cannot read" in stderr
    assert len(stderr.splitlines()) == 1


# -- the model client's list_models ------------------------------------------------------------
def client(base_url: str) -> OpenAIChatClient:
    timeouts = Timeouts(connect_seconds=2.0, read_seconds=5.0)
    return OpenAIChatClient(base_url, "fake-model", timeouts=timeouts)


def test_list_models_names_what_the_server_serves(fakes: Fakes) -> None:
    with client(fakes.model.base_url) as models:
        assert models.list_models() == ("fake-model",)


def test_list_models_fails_with_the_typed_failures(answering: Answering, closed_port: int) -> None:
    with client(f"http://127.0.0.1:{closed_port}/v1") as models, pytest.raises(ModelNotSent):
        models.list_models()
    as_json = "application/json"
    refused = answering(401, b'{"error": {"message": "bad key", "type": "auth"}}', as_json) + "/v1"
    with client(refused) as models, pytest.raises(ModelRejected, match=r"HTTP 401.*bad key"):
        models.list_models()
    garbled = answering(200, b'{"object": "list"}', as_json) + "/v1"
    with client(garbled) as models, pytest.raises(ModelBroken, match="without a list"):
        models.list_models()
