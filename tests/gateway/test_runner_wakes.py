"""The gateway's scheduler and reply thread are woken by the commits they wait for, in any
process, and by due times; not by a timer.

The runner runs in this process with its safety look (the one look it takes without a wake-up)
pushed out to an hour, so each test would hang, and fail on its timeout, if the store's
wake-up did not come: a message admitted by another process is answered, an interrupt another
process records stops the running turn, and a reply the platform rate-limited for a few seconds
goes out once that time has come. Against the fake Bot API as a child process, on a SQLite
file and on PostgreSQL; the other process is a real child process.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from oncewire.gateway import deliveries
from oncewire.gateway import runner as runner_module
from oncewire.gateway.config import load_config
from oncewire.gateway.model_results import (
    DeltaCallback,
    Interrupt,
    ModelInterrupted,
    ModelResponse,
)
from oncewire.gateway.runner import Runner
from oncewire.inbound import InboundState
from tests.conftest import _child_env, wait_for
from tests.gateway.test_telegram_wire import TOKEN, FakeTelegram

pytestmark = pytest.mark.empty_store  # the gateway creates its store

BOT = TOKEN.split(":")[0]
AN_HOUR = 3600.0


class Model:
    """Answers "echo: TEXT" at once, except a message holding "wait", which is answered only
    when its turn is interrupted (then ModelInterrupted, as the real client raises)."""

    def __init__(self) -> None:
        self.waiting = threading.Event()  # a "wait" message is being answered

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] = (),
        on_delta: DeltaCallback | None = None,
        interrupt: Interrupt | None = None,
    ) -> ModelResponse:
        text = str([m["content"] for m in messages if m["role"] == "user"][-1])
        if "wait" in text and interrupt is not None:
            stopped = threading.Event()
            interrupt.on_interrupt(stopped.set)
            self.waiting.set()
            stopped.wait(120)
            raise ModelInterrupted("interrupted")
        return ModelResponse(f"echo: {text}", (), "stop", None, None, None)


@pytest.fixture
def telegram(tmp_path: Path) -> Iterator[FakeTelegram]:
    fake = FakeTelegram(tmp_path / "tg")
    yield fake
    fake.stop()


@pytest.fixture
def gateway(
    tmp_path: Path, store_url: str, telegram: FakeTelegram, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Runner, Model]]:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    monkeypatch.setattr(runner_module, "SAFETY_LOOK_SECONDS", AN_HOUR)
    monkeypatch.setattr(deliveries, "SAFETY_LOOK_SECONDS", AN_HOUR)
    config = tmp_path / "gateway.toml"
    config.write_text(
        f"""
[store]
db = {json.dumps(store_url)}

[model]
base_url = "http://127.0.0.1:9/v1"
api_key_env = ""

[[platforms]]
name = "fk_tg"
kind = "telegram"
api_base = "{telegram.base}"
streaming = false
""",
        encoding="utf-8",
    )
    out, model = io.StringIO(), Model()
    runner = Runner(load_config(config), out=out, model=model, poll_timeout_seconds=1)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    wait_for(lambda: out.getvalue() == "ready\n", what="the runner to be ready")
    try:
        yield runner, model
    finally:
        runner.stop()
        thread.join(60)
        assert not thread.is_alive()


def _elsewhere(db: str, code: str) -> str:
    """Run ``code`` (with ``ledger`` open on ``db``) in a child process; what it printed. The
    store is read there too, not through a second store in this process: closing a file that
    SQLite has open drops the process's locks on it (see the report on opening a store twice)."""
    script = "from oncewire import Ledger\nwith Ledger(DB) as ledger:\n" + textwrap.indent(
        textwrap.dedent(code), "    "
    )
    done = subprocess.run(
        [sys.executable, "-c", f"DB = {db!r}\n{script}"],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _admit_elsewhere(db: str, message_id: str, text: str, *, interrupt: bool = False) -> None:
    _elsewhere(
        db,
        f"""
        from oncewire.gateway.sessions import interrupt_running_turn
        admission = ledger.inbound.admit(
            "fk_tg", {BOT!r}, "4242", {message_id!r}, {{"text": {text!r}}}
        )
        if {interrupt!r}:
            assert interrupt_running_turn(ledger, admission.inbound, "interrupt") is not None
        """,
    )


def _shown(telegram: FakeTelegram, *texts: str) -> None:
    wait_for(lambda: telegram.texts() == list(texts), what=f"{texts} in the chat", timeout=120)


def _status(db: str, inbound_id: int) -> str:
    return _elsewhere(db, f"print(ledger.inbound.get({inbound_id}).status)")


def test_a_message_another_process_admits_is_answered_at_its_commit(
    gateway: tuple[Runner, Model], store_url: str, telegram: FakeTelegram
) -> None:
    telegram.inject(text="first")  # the fake knows a chat once a user wrote in it
    _shown(telegram, "echo: first")
    _admit_elsewhere(store_url, "900", "from another process")
    _shown(telegram, "echo: first", "echo: from another process")


def test_an_interrupt_another_process_records_stops_the_running_turn(
    gateway: tuple[Runner, Model], store_url: str, telegram: FakeTelegram
) -> None:
    _, model = gateway
    telegram.inject(text="please wait for ever")
    wait_for(model.waiting.is_set, what="the turn to be waiting on the model", timeout=120)
    _admit_elsewhere(store_url, "901", "never mind", interrupt=True)
    _shown(telegram, "echo: never mind")
    assert _status(store_url, 1) == InboundState.SUPERSEDED


def test_a_reply_rate_limited_for_a_while_goes_out_when_its_time_comes(
    gateway: tuple[Runner, Model], store_url: str, telegram: FakeTelegram
) -> None:
    # Longer than the engine waits inline (5 s): the reply is given back with a retry time,
    # and the reply thread, asleep until then, delivers it.
    telegram.fault("rate_limit", op="send", retry_after=6, times=1)
    telegram.inject(text="a question")
    _shown(telegram, "echo: a question")
    assert telegram.faults_fired() == ["rate_limit"]  # it was held back once, then sent
