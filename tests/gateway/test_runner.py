"""``oncewire gateway run`` end to end, real processes only: the fake Bot API and the fake
OpenAI-compatible server as child processes, the gateway as a child process in a process group
of its own (killed with SIGKILL, or drained with SIGTERM), a SQLite file (one test also on
PostgreSQL). What the user sees is read from the fake's journal (ChatView); what happened, from
the store, read directly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.inbound import InboundState
from oncewire.replies import TELEGRAM_LIKE, OpKind, OpState, ReplyState
from tests.conftest import _child_env, wait_for
from tests.gateway.conftest import FakeOpenAI
from tests.gateway.test_telegram_wire import TOKEN, FakeTelegram

pytestmark = pytest.mark.empty_store  # the gateway creates its store

PLATFORM = "fk_tg"  # the gateway's platform name, and the fake's journal name
RESUME_PHRASE = "previous turn was interrupted"


class Gateway:
    """A running ``python -m oncewire gateway run``, in a process group of its own."""

    def __init__(
        self,
        config: Path,
        log: Path,
        grace_seconds: float = 20.0,
        env: dict[str, str] | None = None,
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
                env=_child_env(TELEGRAM_BOT_TOKEN=TOKEN, **(env or {})),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "ready":
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

    def _close(self) -> None:
        if self.process.stdout is not None and not self.process.stdout.closed:
            self.process.stdout.close()

    def terminate(self, timeout: float = 60.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=timeout)
        self._close()
        return code


class Rig:
    """The two fakes, a gateway.toml pointing at them and the store, for one test."""

    def __init__(self, tmp_path: Path, script: Any, db: str, *, streaming: bool = True) -> None:
        self.tmp_path = tmp_path
        self.db = db
        self.telegram = FakeTelegram(tmp_path / "tg")
        self.model = FakeOpenAI(tmp_path / "openai", script)
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
max_concurrent = 2

[[platforms]]
name = "{PLATFORM}"
kind = "telegram"
token_env = "TELEGRAM_BOT_TOKEN"
api_base = "{self.telegram.base}"
streaming = {json.dumps(streaming)}
edit_interval_seconds = 0.05
""",
            encoding="utf-8",
        )
        self.gateways: list[Gateway] = []

    def start(self, grace_seconds: float = 20.0, env: dict[str, str] | None = None) -> Gateway:
        """Start ``gateway run`` on the rig's config; ``env`` is added to its environment (an
        armed crash point, say)."""
        gateway = Gateway(self.config, self.tmp_path / "gateway.log", grace_seconds, env)
        self.gateways.append(gateway)
        return gateway

    def ledger(self) -> Ledger:
        return Ledger(self.db, create=False)

    def inbound(self, inbound_id: int) -> Any:
        with self.ledger() as ledger:
            return ledger.inbound.get(inbound_id)

    def wait_status(self, inbound_id: int, status: InboundState, timeout: float = 30.0) -> None:
        def reached() -> bool:
            with self.ledger() as ledger:
                found = ledger.inbound.list(limit=100)
            return any(i.id == inbound_id and i.status is status for i in found)

        wait_for(reached, timeout=timeout, what=f"inbound {inbound_id} to be {status}")

    def status_output(self, *options: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "oncewire", "gateway", "status", "--db", self.db, *options],
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def status(self) -> list[dict[str, Any]]:
        sessions: list[dict[str, Any]] = json.loads(self.status_output("--json"))["sessions"]
        return sessions

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.kill()
        self.telegram.stop()
        self.model.stop()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(script: Any, *, db: str | None = None, streaming: bool = True) -> Rig:
        made.append(Rig(tmp_path, script, db or str(tmp_path / "gateway.db"), streaming=streaming))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def bot_messages(rig: Rig) -> list[tuple[str, bool]]:
    # The fake shows only the bot's messages (injected user messages are updates, not sends).
    return [TELEGRAM_LIKE.strip_marker(m.text) for m in rig.telegram.shown()]


def run_events(ledger: Ledger, inbound_id: int) -> list[str]:
    return [event.type for event in ledger.runs.events(f"turn:{inbound_id}")]


def assert_answered_once(rig: Rig, inbound_id: int, text: str) -> None:
    """The store says the message was answered once with ``text`` and delivered."""
    with rig.ledger() as ledger:
        inbound = ledger.inbound.get(inbound_id)
        assert inbound.status is InboundState.DELIVERED
        reply = ledger.replies.for_inbound(inbound_id)
        assert reply is not None
        assert reply.state is ReplyState.DELIVERED and reply.final_text == text
        run = ledger.runs.get(f"turn:{inbound_id}")
        assert run.status == "answered" and run.state["steps"] == 1
        assert all(v.ok for v in ledger.runs.verify())


def test_one_message_gets_exactly_one_reply_with_the_model_text(
    rig: Callable[..., Rig], store_url: str
) -> None:
    answer = "Hello from the model, streamed in small pieces."
    r = rig([{"kind": "text", "text": answer, "chunk_chars": 6}], db=store_url)
    gateway = r.start()
    r.telegram.inject(text="hi there")
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [(answer, False)]
    assert_answered_once(r, 1, answer)
    with r.ledger() as ledger:
        assert run_events(ledger, 1) == ["run_started", "step_recorded", "run_terminated"]
    (request,) = r.model.requests()
    assert request["body"]["messages"][-1] == {"role": "user", "content": "hi there"}
    assert gateway.terminate() == 0
    log = gateway.log_text()
    for line in ("turn start inbound=1", "turn commit inbound=1", "turn deliver inbound=1"):
        assert line in log, log


@pytest.mark.crash
def test_a_gateway_killed_while_the_model_hangs_answers_once_after_a_restart(
    rig: Callable[..., Rig],
) -> None:
    r = rig(
        [
            {"kind": "hang", "seconds": 600},
            {"kind": "text", "text": "The complete first answer."},
            {"kind": "text", "text": "The second answer, after the first."},
        ]
    )
    first = r.start()
    r.telegram.inject(text="first question")
    wait_for(lambda: len(r.model.requests()) == 1, what="the model request")
    r.telegram.inject(text="/queue second question")  # queued behind the hung turn
    r.wait_status(2, InboundState.RECEIVED)
    first.kill()

    (session,) = r.status()
    assert session["active_turn"] == "turn:1"
    assert (session["answering"], session["received"]) == (1, 1)
    assert (session["answered_not_delivered"], session["quarantined"]) == (0, 0)
    header, row = r.status_output().splitlines()
    assert header.split()[:5] == ["PLATFORM", "BOT", "CHAT", "THREAD", "ACTIVE_TURN"]
    assert row.split()[:4] == [PLATFORM, TOKEN.split(":")[0], r.telegram.chat, "turn:1"]

    second = r.start()
    r.wait_status(2, InboundState.DELIVERED)
    assert bot_messages(r) == [
        ("The complete first answer.", False),
        ("The second answer, after the first.", False),
    ]
    assert_answered_once(r, 1, "The complete first answer.")
    assert_answered_once(r, 2, "The second answer, after the first.")
    with r.ledger() as ledger:
        assert ledger.inbound.get(1).attempts == 2 and ledger.inbound.get(2).attempts == 1
        assert run_events(ledger, 1) == [
            "run_started",
            "run_resumed",
            "step_recorded",
            "run_terminated",
        ]
    requests = r.model.requests()
    assert len(requests) == 3
    resumed = requests[1]["body"]["messages"]
    assert resumed[-2] == {"role": "user", "content": "first question"}
    assert RESUME_PHRASE in resumed[-1]["content"].lower()
    assert RESUME_PHRASE not in json.dumps(requests[2]["body"]).lower()
    assert r.status() == []
    assert "nothing pending" in r.status_output()
    assert second.terminate() == 0


@pytest.mark.crash
def test_a_reply_committed_but_not_delivered_when_killed_is_delivered_once_after_a_restart(
    rig: Callable[..., Rig],
) -> None:
    answer = "An answer whose delivery was cut short."
    r = rig([{"kind": "text", "text": answer}], streaming=False)
    # The send parks on the platform (never applied while the test runs).
    r.telegram.fault("hold", op="send", hold_seconds=600)
    first = r.start()
    r.telegram.inject(text="question")

    def send_in_flight() -> bool:
        with r.ledger() as ledger:
            reply = ledger.replies.for_inbound(1)
            ops = [] if reply is None else ledger.replies.ops(reply.id)
        return any(op.kind is OpKind.SEND and op.state is OpState.IN_FLIGHT for op in ops)

    wait_for(send_in_flight, what="the final send to be in flight")
    first.kill()
    assert r.inbound(1).status is InboundState.ANSWERED
    (session,) = r.status()
    assert session["active_turn"] is None
    assert (session["answered_not_delivered"], session["answering"]) == (1, 0)

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    # One copy: the parked send may have landed as far as the gateway knows, so it is marked.
    assert bot_messages(r) == [(answer, True)]
    assert_answered_once(r, 1, answer)
    assert len(r.model.requests()) == 1  # the answer was never asked for again
    with r.ledger() as ledger:
        assert run_events(ledger, 1) == ["run_started", "step_recorded", "run_terminated"]
    assert second.terminate() == 0


def test_sigterm_lets_the_running_turn_finish_and_exits_0(rig: Callable[..., Rig]) -> None:
    answer = "A slow answer that the drain lets finish."
    r = rig([{"kind": "text", "text": answer, "chunk_chars": 4, "delay_per_chunk": 0.1}])
    gateway = r.start()
    r.telegram.inject(text="take your time")
    wait_for(lambda: len(r.model.requests()) == 1, what="the model request")
    assert r.inbound(1).status is InboundState.ANSWERING
    assert gateway.terminate() == 0
    assert_answered_once(r, 1, answer)
    assert bot_messages(r) == [(answer, False)]
    # The answer streamed into one message: previews, then the final edit.
    (message,) = r.telegram.shown()
    assert message.edits >= 1
    assert "draining" in gateway.log_text()


def test_a_model_that_keeps_failing_gets_an_honest_failure_reply(rig: Callable[..., Rig]) -> None:
    r = rig({"default": {"kind": "error", "status": 503}})
    gateway = r.start()
    r.telegram.inject(text="anyone there?")
    r.wait_status(1, InboundState.DELIVERED)
    ((text, marked),) = bot_messages(r)
    assert "model service is unavailable" in text and not marked
    assert len(r.model.requests()) == 2  # max_retries = 1
    with r.ledger() as ledger:
        run = ledger.runs.get("turn:1")
        assert (run.status, run.terminal_reason) == ("failed", "model_unavailable")
        assert all(v.ok for v in ledger.runs.verify())
    assert gateway.terminate() == 0


def test_a_turn_still_running_after_the_grace_period_is_resumed_by_the_next_start(
    rig: Callable[..., Rig],
) -> None:
    answer = "Answered by the next start."
    r = rig([{"kind": "hang", "seconds": 600}, {"kind": "text", "text": answer}])
    first = r.start(grace_seconds=0.5)
    r.telegram.inject(text="a question the drain cannot wait for")
    wait_for(lambda: len(r.model.requests()) == 1, what="the model request")
    assert first.terminate() == 0  # the hung stream was interrupted, not waited for
    assert "still running after the grace period" in first.log_text()
    (session,) = r.status()
    assert (session["active_turn"], session["answering"]) == ("turn:1", 1)
    assert bot_messages(r) == []

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [(answer, False)]
    assert_answered_once(r, 1, answer)
    assert RESUME_PHRASE in r.model.requests()[1]["body"]["messages"][-1]["content"].lower()
    assert second.terminate() == 0


def test_a_rate_limited_model_is_asked_again_when_it_says(rig: Callable[..., Rig]) -> None:
    answer = "Answered once the rate limit passed."
    r = rig(
        [{"kind": "error", "status": 429, "retry_after_ms": 200}, {"kind": "text", "text": answer}]
    )
    gateway = r.start()
    r.telegram.inject(text="busy?")
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [(answer, False)]
    assert_answered_once(r, 1, answer)
    assert len(r.model.requests()) == 2
    assert gateway.terminate() == 0
