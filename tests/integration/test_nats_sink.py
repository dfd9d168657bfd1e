"""NatsJetStreamSink against the real NATS server with JetStream on 127.0.0.1:4222.

Each test makes a stream of its own (its own name and subjects) and deletes it at the end. What
the sink answered is checked against what the stream holds, read with a client of the test's own:
the number of messages, and each message's ``Nats-Msg-Id``. The redelivery test kills a real
dispatcher process between the publish and its record (``dispatch.after_sink_before_record``);
the next dispatcher's redelivered attempt is one stored message, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from oncewire.core import crash
from oncewire.core.errors import ConfigurationError
from oncewire.dispatch import Dispatcher
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, MaybeSent, NotSent, Rejected
from oncewire.ledger import Ledger
from oncewire.storage.records import EffectState
from tests.conftest import _child_env, _python_child

nats = pytest.importorskip("nats")
from oncewire.sinks.nats import NatsJetStreamSink  # noqa: E402

SERVER = "nats://127.0.0.1:4222"


def _nats_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 4222), timeout=2):
            return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(not _nats_answers(), reason="no NATS server on 127.0.0.1:4222"),
    pytest.mark.empty_store,
]


class Stream:
    """A JetStream stream of the test's own, read with the test's own client."""

    def __init__(self, **config: Any) -> None:
        self.name = "OW" + uuid.uuid4().hex[:10].upper()
        self.subject = f"{self.name.lower()}.orders"
        asyncio.run(
            self._call(
                lambda js: js.add_stream(
                    name=self.name, subjects=[f"{self.name.lower()}.>"], **config
                )
            )
        )

    async def _call(self, use: Callable[[Any], Any]) -> Any:
        nc = await nats.connect(SERVER)
        try:
            return await use(nc.jetstream())
        finally:
            await nc.drain()

    def messages(self) -> list[tuple[str, Any]]:
        """(Nats-Msg-Id, payload) of every stored message, in order."""

        async def read(js: Any) -> list[tuple[str, Any]]:
            info = await js.stream_info(self.name)
            found = []
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                if info.state.messages == 0:
                    break
                msg = await js.get_msg(self.name, seq)
                found.append((msg.headers["Nats-Msg-Id"], json.loads(msg.data)))
            return found

        result: list[tuple[str, Any]] = asyncio.run(self._call(read))
        return result

    def delete(self) -> None:
        asyncio.run(self._call(lambda js: js.delete_stream(self.name)))


@pytest.fixture
def stream() -> Iterator[Callable[..., Stream]]:
    made: list[Stream] = []

    def make(**config: Any) -> Stream:
        made.append(Stream(**config))
        return made[-1]

    yield make
    for one in made:
        one.delete()


def attempt(key: str, number: int = 1, *, redelivery: bool = False) -> Attempt:
    return Attempt(key, "order", {"order": key}, number, redelivery, fence=number)


def publish(sink: NatsJetStreamSink, *attempts: Attempt) -> list[Any]:
    async def run() -> list[Any]:
        try:
            return [await sink(a) for a in attempts]
        finally:
            await sink.aclose()

    return asyncio.run(run())


def test_a_publish_is_stored_once_per_key_and_a_redelivery_is_a_duplicate(
    stream: Callable[..., Stream],
) -> None:
    s = stream(duplicate_window=120)
    first, again, other = publish(
        NatsJetStreamSink(s.subject),
        attempt("k1"),
        attempt("k1", 2, redelivery=True),
        attempt("k2"),
    )
    assert first == Done({"stream": s.name, "seq": 1, "duplicate": False})
    assert again == Done({"stream": s.name, "seq": 1, "duplicate": True})
    assert other == Done({"stream": s.name, "seq": 2, "duplicate": False})
    assert s.messages() == [("k1", {"order": "k1"}), ("k2", {"order": "k2"})]


def test_what_jetstream_answers_becomes_the_truthful_outcome(
    stream: Callable[..., Stream],
) -> None:
    full = stream(max_msgs=1, discard="new")
    stored, refused = publish(NatsJetStreamSink(full.subject), attempt("a"), attempt("b"))
    assert isinstance(stored, Done)
    assert isinstance(refused, NotSent) and "maximum messages" in refused.reason
    assert [key for key, _ in full.messages()] == ["a"]  # the refused one was not stored

    (nowhere,) = publish(NatsJetStreamSink(f"nobody.{uuid.uuid4().hex}"), attempt("c"))
    assert isinstance(nowhere, NotSent) and "no JetStream stream" in nowhere.reason

    (elsewhere,) = publish(NatsJetStreamSink(full.subject, stream="ANOTHER"), attempt("d"))
    assert isinstance(elsewhere, Rejected)
    assert [key for key, _ in full.messages()] == ["a"]


def test_no_server_is_not_sent(unused_port: int) -> None:
    (outcome,) = publish(
        NatsJetStreamSink("x.y", servers=f"nats://127.0.0.1:{unused_port}"), attempt("k")
    )
    assert isinstance(outcome, NotSent) and "no connection to NATS" in outcome.reason


def test_no_acknowledgement_in_time_is_maybe_sent() -> None:
    """A core subscriber that never answers stands for a JetStream that took the message and
    whose acknowledgement never came: the sink cannot know, so it says so."""
    subject = f"silent.{uuid.uuid4().hex}"

    async def run() -> Any:
        nc = await nats.connect(SERVER)

        async def ignore(_: Any) -> None:
            return None

        await nc.subscribe(subject, cb=ignore)
        sink = NatsJetStreamSink(subject, timeout_seconds=0.3)
        try:
            return await sink(attempt("k"))
        finally:
            await sink.aclose()
            await nc.drain()

    outcome = asyncio.run(run())
    assert isinstance(outcome, MaybeSent) and "no acknowledgement" in outcome.reason


@pytest.fixture
def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_dispatcher_publishes_every_accepted_effect_once(
    stream: Callable[..., Stream], store_url: str
) -> None:
    s = stream(duplicate_window=120)
    keys = [f"order-{i}" for i in range(6)]
    with Ledger(store_url) as ledger:
        with ledger.transaction() as tx:
            for key in keys:
                tx.accept(key, "order", {"order": key})
        Dispatcher(ledger, {"order": NatsJetStreamSink(s.subject)}, concurrency=3).run(
            until_idle=True, handle_signals=False
        )
        effects = [ledger.effects.get(key) for key in keys]
    assert [e.state for e in effects] == [EffectState.DONE] * 6
    assert sorted(key for key, _ in s.messages()) == keys


CHILD = """
import sys
from oncewire.dispatch import Dispatcher
from oncewire.ledger import Ledger
from oncewire.sinks.nats import NatsJetStreamSink

with Ledger(sys.argv[1]) as ledger:
    sinks = {"order": NatsJetStreamSink(sys.argv[2])}
    Dispatcher(ledger, sinks, lease_seconds=1.0).run(until_idle=True)
"""


@pytest.mark.crash
def test_a_redelivery_after_a_kill_between_publish_and_record_is_stored_once(
    stream: Callable[..., Stream], store_url: str
) -> None:
    s = stream(duplicate_window=120)
    with Ledger(store_url) as ledger:
        ledger.accept("order-1", "order", {"order": "order-1"})
    child = _python_child(
        CHILD,
        store_url,
        s.subject,
        env=_child_env(**{crash.ENV_POINTS: "dispatch.after_sink_before_record"}),
    )
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, stderr
    assert s.messages() == [("order-1", {"order": "order-1"})]  # published, then killed
    with Ledger(store_url) as ledger:
        assert ledger.effects.get("order-1").state is EffectState.CLAIMED  # never recorded
        time.sleep(1.5)  # past the dead dispatcher's lease
        Dispatcher(ledger, {"order": NatsJetStreamSink(s.subject)}).run(
            until_idle=True, handle_signals=False
        )
        effect = ledger.effects.get("order-1")
        last = ledger.effects.attempts("order-1")[-1]
    assert effect.state is EffectState.DONE
    assert json.loads(effect.result_json or "null") == {
        "stream": s.name,
        "seq": 1,
        "duplicate": True,
    }
    assert (last.outcome, last.redelivery) == ("done", True)
    assert s.messages() == [("order-1", {"order": "order-1"})]  # the redelivery stored nothing


@pytest.mark.parametrize("servers", [5, [], [""], [None]])
def test_servers_that_name_no_server_are_refused_when_built(servers: Any) -> None:
    with pytest.raises(ConfigurationError, match="servers must be a NATS URL"):
        NatsJetStreamSink("a.b", servers=servers)
