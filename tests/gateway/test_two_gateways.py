"""Two ``gateway run`` processes on one store: bot leases, a standby, a takeover.

Real processes only: two fake Bot API processes (two bots, two tokens), the fake model server,
and two gateways in process groups of their own, on PostgreSQL and on one SQLite file. Gateway
A starts first and serves both bots; B stands by. A is SIGKILLed while both bots' turns are
mid-stream (their model streams stalled after a preview); B takes both bots over, resumes the
turns and answers them, and answers what comes next. What the users saw is read from the
fakes' journals (ChatView), what happened from the store; never from the gateways' logs.

The fake Bot API answers the older of two concurrent ``getUpdates`` with 409 (as Telegram
does), and ends unanswered a poll whose client hung up (journaled 499), so a 409 in its journal
means two live processes polled one bot at once: the tests assert there is none.
"""

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
from oncewire.replies import TELEGRAM_LIKE, OpState, ReplyState
from oncewire.storage.verbs.leases import Lease
from tests.conftest import _child_env, wait_for
from tests.gateway.conftest import FakeOpenAI, PlatformFakeProcess
from tests.support.pg import fresh_schema, server_url

BOTS = {  # platform name (and the fake's journal name) -> (token, chat)
    "tg_a": ("111111:fake-token-of-bot-a", "5001"),
    "tg_b": ("222222:fake-token-of-bot-b", "5002"),
}
BOT_LEASE_SECONDS = 3
ENV = {"TG_A_TOKEN": BOTS["tg_a"][0], "TG_B_TOKEN": BOTS["tg_b"][0]}


class Bot(PlatformFakeProcess):
    """One fake Bot API process serving one bot."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory, self.name = directory, name
        self.token, self.chat = BOTS[name]
        args = ["--port", "0", "--journal", str(directory), "--token", self.token, "--name", name]
        super().__init__("oncewire.testing.telegram_api", args)

    def inject(self, text: str) -> None:
        self.call("inject", chat_id=int(self.chat), text=text)

    def shown(self) -> list[tuple[str, bool]]:
        from oncewire.testing.fake_platform import ChatView

        view = ChatView([self.directory / "chat.jsonl"])
        return [TELEGRAM_LIKE.strip_marker(m.text) for m in view.visible(self.name, self.chat)]

    def polls(self) -> list[dict[str, Any]]:
        path = self.directory / "calls.jsonl"
        calls = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        return [c for c in calls if c["method"].lower() == "getupdates"]


class Gateway:
    """``python -m oncewire gateway run`` in a process group of its own; ``ready`` is its
    first stdout line."""

    def __init__(self, config: Path, log: Path) -> None:
        self.log = log
        with open(log, "a", encoding="utf-8") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "oncewire", "gateway", "run", "--config", str(config)],
                env=_child_env(**ENV),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        assert self.process.stdout is not None
        self.ready = self.process.stdout.readline().strip()
        if not self.ready.startswith("ready"):
            self.kill()
            raise AssertionError(f"the gateway did not start: {self.ready!r}\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=120)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


class Rig:
    def __init__(self, tmp_path: Path, db: str, script: Any, max_concurrent: int = 4) -> None:
        self.tmp_path, self.db = tmp_path, db
        self.bots = {name: Bot(tmp_path / name, name) for name in BOTS}
        self.model = FakeOpenAI(tmp_path / "openai", script)
        platforms = "".join(
            f"""
[[platforms]]
name = "{name}"
kind = "telegram"
token_env = "{"TG_A_TOKEN" if name == "tg_a" else "TG_B_TOKEN"}"
api_base = "{bot.base}"
streaming = true
edit_interval_seconds = 0.05
"""
            for name, bot in self.bots.items()
        )
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
read_timeout = 120

[turns]
max_concurrent = {max_concurrent}

[leases]
bot_lease_seconds = {BOT_LEASE_SECONDS}
turn_lease_seconds = 6
{platforms}""",
            encoding="utf-8",
        )
        self.gateways: list[Gateway] = []

    def start(self, label: str) -> Gateway:
        gateway = Gateway(self.config, self.tmp_path / f"gateway-{label}.log")
        self.gateways.append(gateway)
        return gateway

    def ledger(self) -> Ledger:
        return Ledger(self.db, create=False)

    def _leases(self) -> dict[str, Lease]:
        """Each bot's lease as stored, for the bots that have one."""
        with self.ledger() as ledger:
            found = {
                name: ledger.store.get_lease(f"bot:{name}:{token.split(':')[0]}")
                for name, (token, _) in BOTS.items()
            }
        return {name: lease for name, lease in found.items() if lease}

    def lease_owners(self) -> dict[str, tuple[str | None, int]]:
        return {name: (lease.owner, lease.fence) for name, lease in self._leases().items()}

    def lease_expiries(self) -> dict[str, float]:
        """Each held bot lease's expiry, which its holder's renewals move on."""
        return {name: lease.expires_at for name, lease in self._leases().items()}

    def inbounds(self) -> dict[str, list[Any]]:
        with self.ledger() as ledger:
            found = ledger.inbound.list(limit=100)
        by_platform: dict[str, list[Any]] = {name: [] for name in BOTS}
        for inbound in found:
            by_platform[inbound.platform].append(inbound)
        return by_platform

    def delivered(self, count: int) -> bool:
        with self.ledger() as ledger:
            found = ledger.inbound.list(limit=100)
        return len(found) == count and all(i.status is InboundState.DELIVERED for i in found)

    def stop(self) -> None:
        for gateway in self.gateways:
            gateway.kill()
        for bot in self.bots.values():
            bot.stop()
        self.model.stop()


def pid_of(owner: str | None) -> int:
    assert owner is not None
    return int(owner.split(":")[1])


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "gateway.db")
        return
    pytest.importorskip("psycopg")
    with fresh_schema(server_url(), "two_gw") as url:
        yield url


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(db: str, script: Any, max_concurrent: int = 4) -> Rig:
        made.append(Rig(tmp_path, db, script, max_concurrent))
        return made[-1]

    yield make
    for one in made:
        one.stop()


def assert_answered_once(r: Rig, answers: dict[str, list[str]]) -> None:
    """Each bot's chat shows exactly ``answers`` (one unmarked message per inbound, in order),
    and the store says each inbound was answered with that text and delivered, once."""
    for name, bot in r.bots.items():
        assert bot.shown() == [(text, False) for text in answers[name]], name
    with r.ledger() as ledger:
        for name, inbounds in r.inbounds().items():
            assert len(inbounds) == len(answers[name])
            for inbound, text in zip(
                sorted(inbounds, key=lambda i: i.id), answers[name], strict=True
            ):
                assert inbound.status is InboundState.DELIVERED
                reply = ledger.replies.for_inbound(inbound.id)
                assert reply is not None and reply.state is ReplyState.DELIVERED
                assert reply.final_text == text
                run = ledger.runs.get(f"turn:{inbound.id}")
                assert run.status == "answered"
        assert all(v.ok for v in ledger.runs.verify())


def assert_never_polled_twice_at_once(r: Rig) -> None:
    for bot in r.bots.values():
        polls = bot.polls()
        assert polls, f"{bot.name} was never polled"
        assert [c for c in polls if c["status"] == 409] == [], bot.name


@pytest.mark.crash
def test_the_standby_takes_both_bots_over_after_a_sigkill_mid_turn(
    rig: Callable[..., Rig], store_url: str
) -> None:
    full = {
        "tg_a": "Alpha: the whole answer, resumed by the standby.",
        "tg_b": "Beta: the whole answer, resumed by the standby.",
    }
    after = {"tg_a": "Alpha again, from the new holder.", "tg_b": "Beta again, from it too."}
    stall = {"kind": "stall_mid_stream", "after_chars": 12, "chunk_chars": 4, "seconds": 600}
    r = rig(
        store_url,
        {
            "by_token": {
                "alpha-token": [{**stall, "text": full["tg_a"]}],
                "beta-token": [{**stall, "text": full["tg_b"]}],
                "alpha-later": [{"kind": "text", "text": after["tg_a"]}],
                "beta-later": [{"kind": "text", "text": after["tg_b"]}],
            },
            "resume": {
                "alpha-token": [{"kind": "text", "text": full["tg_a"]}],
                "beta-token": [{"kind": "text", "text": full["tg_b"]}],
            },
        },
    )
    a = r.start("a")
    assert a.ready == "ready"
    b = r.start("b")
    assert b.ready == "ready standby=tg_a,tg_b"
    owners = r.lease_owners()
    assert {name: (pid_of(owner), fence) for name, (owner, fence) in owners.items()} == {
        "tg_a": (a.process.pid, 1),
        "tg_b": (a.process.pid, 1),
    }

    r.bots["tg_a"].inject("first question alpha-token")
    r.bots["tg_b"].inject("first question beta-token")

    def both_previewed() -> bool:
        return all(len(bot.shown()) == 1 for bot in r.bots.values())

    wait_for(both_previewed, timeout=60, what="a preview in both chats, their streams stalled")

    def previews_recorded() -> bool:
        # The fake shows a send before its answer reaches the gateway: killed in between, the
        # send's outcome is unknown and the answer is rightly resent marked. This test is about
        # a turn whose preview is on record, so it kills only once both acks are.
        with r.ledger() as ledger:
            replies = [ledger.replies.for_inbound(i) for i in (1, 2)]
            return all(
                reply is not None
                and any(op.state is OpState.ACKED for op in ledger.replies.ops(reply.id))
                for reply in replies
            )

    wait_for(previews_recorded, timeout=30, what="both previews' sends acknowledged in the store")
    with r.ledger() as ledger:
        runs = [ledger.runs.get(f"turn:{i}") for i in (1, 2)]
    assert [(run.status, pid_of(run.owner)) for run in runs] == [("running", a.process.pid)] * 2
    a.kill()

    wait_for(lambda: r.delivered(2), timeout=120, what="both turns answered by the standby")
    owners = r.lease_owners()
    assert {name: (pid_of(owner), fence) for name, (owner, fence) in owners.items()} == {
        "tg_a": (b.process.pid, 2),
        "tg_b": (b.process.pid, 2),
    }
    # The new holder polls: what comes next is answered by it.
    r.bots["tg_a"].inject("second question alpha-later")
    r.bots["tg_b"].inject("second question beta-later")
    wait_for(lambda: r.delivered(4), timeout=120, what="the next messages answered")

    assert_answered_once(r, {name: [full[name], after[name]] for name in BOTS})
    with r.ledger() as ledger:
        for inbound_id in (1, 2):
            events = [e.type for e in ledger.runs.events(f"turn:{inbound_id}")]
            assert events == ["run_started", "run_resumed", "step_recorded", "run_terminated"]
            assert pid_of(ledger.runs.get(f"turn:{inbound_id}").owner) == b.process.pid
    assert len(r.model.requests()) == 6  # two stalled, two resumed, two new: none asked twice
    assert_never_polled_twice_at_once(r)
    assert b.terminate() == 0
    assert {name: owner for name, (owner, _) in r.lease_owners().items()} == {
        "tg_a": None,
        "tg_b": None,
    }


def test_a_drained_gateway_hands_its_bots_to_the_standby_and_no_bot_is_polled_twice(
    rig: Callable[..., Rig], tmp_path: Path
) -> None:
    pytest.importorskip("psycopg")
    with fresh_schema(server_url(), "two_gw_drain") as url:
        r = rig(
            url,
            {
                "by_token": {
                    "alpha-one": [{"kind": "text", "text": "One for alpha."}],
                    "beta-one": [{"kind": "text", "text": "One for beta."}],
                    "alpha-two": [{"kind": "text", "text": "Two for alpha."}],
                    "beta-two": [{"kind": "text", "text": "Two for beta."}],
                }
            },
        )
        a = r.start("a")
        b = r.start("b")
        assert (a.ready, b.ready) == ("ready", "ready standby=tg_a,tg_b")
        r.bots["tg_a"].inject("alpha-one")
        r.bots["tg_b"].inject("beta-one")
        wait_for(lambda: r.delivered(2), timeout=60, what="the first messages answered by A")
        # Both run side by side for a whole lease period (the standby asks for the leases every
        # second): A renews both leases past the expiry they had, and B takes neither.
        first = r.lease_expiries()
        wait_for(
            lambda: all(
                r.lease_expiries()[name] >= first[name] + BOT_LEASE_SECONDS for name in BOTS
            ),
            timeout=60,
            what="A to renew both bot leases through a lease period",
        )
        owners = r.lease_owners().values()
        # Said when it fails: whether A was still alive, and what both logged about the leases.
        said = (
            f"A exit code {a.process.poll()}\n"
            f"A:\n{a.log_text()[-3000:]}\nB:\n{b.log_text()[-3000:]}"
        )
        assert {(pid_of(owner), fence) for owner, fence in owners} == {(a.process.pid, 1)}, said
        assert a.terminate() == 0
        # Given back at the end of the drain, then taken by the standby.
        wait_for(
            lambda: all(
                owner is not None and pid_of(owner) == b.process.pid
                for owner, _ in r.lease_owners().values()
            ),
            timeout=60,
            what="the standby to hold both leases",
        )
        assert {fence for _, fence in r.lease_owners().values()} == {2}
        r.bots["tg_a"].inject("alpha-two")
        r.bots["tg_b"].inject("beta-two")
        wait_for(lambda: r.delivered(4), timeout=60, what="the next messages answered by B")
        assert_answered_once(
            r,
            {
                "tg_a": ["One for alpha.", "Two for alpha."],
                "tg_b": ["One for beta.", "Two for beta."],
            },
        )
        assert_never_polled_twice_at_once(r)
        assert b.terminate() == 0
        r.stop()


def test_a_turn_whose_lease_is_taken_stops_without_writing_anything_more(
    rig: Callable[..., Rig], tmp_path: Path
) -> None:
    """The turn's lease is renewed while its model stream is stalled; another owner takes the
    turn over (fence 2): the renewal is refused, the turn stops at once and writes nothing.
    With one worker, the next message (another session) can only start once it stopped."""
    r = rig(
        str(tmp_path / "gateway.db"),
        {
            "by_token": {
                "slow-token": [
                    {
                        "kind": "stall_mid_stream",
                        "text": "A preview, then a stall.",
                        "after_chars": 9,
                        "chunk_chars": 3,
                        "seconds": 600,
                    }
                ],
                "next-token": [{"kind": "text", "text": "The next answer."}],
            }
        },
        max_concurrent=1,
    )
    a = r.start("a")
    r.bots["tg_a"].inject("question slow-token")
    wait_for(lambda: len(r.bots["tg_a"].shown()) == 1, timeout=60, what="the stalled preview")
    with r.ledger() as ledger:
        run = ledger.runs.get("turn:1")
        assert run.owner is not None and pid_of(run.owner) == a.process.pid and run.fence == 1
        ledger.runs.turn.resume(
            1, owner="intruder", from_fence=1, lease_seconds=600, dead_owners=[run.owner]
        )
    r.bots["tg_b"].inject("question next-token")
    wait_for(
        lambda: [i.status for i in r.inbounds()["tg_b"]] == [InboundState.DELIVERED],
        timeout=60,
        what="the next message answered, after the lost turn freed the only worker",
    )
    with r.ledger() as ledger:
        run = ledger.runs.get("turn:1")
        assert (run.owner, run.fence, run.status) == ("intruder", 2, "running")
        assert [e.type for e in ledger.runs.events("turn:1")] == ["run_started", "run_resumed"]
        reply = ledger.replies.for_inbound(1)
        assert reply is not None and reply.state is ReplyState.OPEN
        assert ledger.inbound.get(1).status is InboundState.ANSWERING
    slow = [q for q in r.model.requests() if "slow-token" in json.dumps(q["body"])]
    assert len(slow) == 1  # stopped, never asked again
    assert r.bots["tg_b"].shown() == [("The next answer.", False)]
    assert a.process.poll() is None  # the gateway itself goes on
    assert a.terminate() == 0
