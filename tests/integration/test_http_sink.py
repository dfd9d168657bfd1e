"""HttpSink against a real loopback HTTP server that counts what reaches it.

Every row of the sink's outcome table is produced by a real exchange: a stdlib
ThreadingHTTPServer in a thread answers by path (a status with or without Retry-After, a JSON or
text body, a stall after reading the request, a response cut short), a closed port refuses, a
listening socket whose backlog is full lets the connect time out, a name under ``.invalid`` does
not resolve. Each outcome is checked against the server's own journal (did the request arrive,
with which headers), not against what the sink says about itself. End to end, a real Dispatcher
on SQLite and on PostgreSQL sends through the sink to a receiver that honours Idempotency-Key;
a redelivered effect (after a timeout, and after a real SIGKILL between the send and its record)
carries the key and ``Oncewire-Redelivery: 1``, and the receiver's work is done once.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from oncewire.core import crash
from oncewire.core.errors import ConfigurationError
from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.dispatch import Dispatcher, RetryPolicy
from oncewire.effects.attempt import Attempt
from oncewire.effects.outcomes import Done, EffectOutcome, MaybeSent, NotSent, Rejected
from oncewire.ledger import Ledger
from oncewire.storage.records import EffectState
from oncewire.testing import ManualClock
from tests.conftest import _child_env, _python_child, wait_for
from tests.support.runs_db import RunsDatabase

pytest.importorskip("httpx2")
from oncewire.sinks import HttpSink


class Journal:
    """What reached the server: one entry per request whose body was read whole."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.work: dict[str, int] = {}  # Idempotency-Key -> times the receiver did the work
        self.results: dict[str, dict[str, Any]] = {}
        self.release = threading.Event()

    def record(self, path: str, headers: dict[str, str], body: bytes) -> None:
        with self.lock:
            self.requests.append({"path": path, "headers": headers, "body": json.loads(body)})

    def on(self, path: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.requests if urlsplit(r["path"]).path == path]


def _handler(journal: Journal) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _answer(
            self, status: int, body: bytes = b"", headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {k.lower(): v for k, v in self.headers.items()}
            journal.record(self.path, headers, body)
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            route = url.path.strip("/").split("/")
            if route[0] == "status":
                extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
                self._answer(int(route[1]), b"told so", extra)
            elif route[0] == "json":
                self._answer(200, b'{"id": 7, "ok": true}', {"Content-Type": "application/json"})
            elif route[0] == "badjson":
                self._answer(200, b"{not json", {"Content-Type": "application/json"})
            elif route[0] == "text":
                self._answer(200, b"plain words", {"Content-Type": "text/plain"})
            elif route[0] == "empty":
                self._answer(204)
            elif route[0] == "stall":
                journal.release.wait(30)  # read whole, never answered
                self.close_connection = True
            elif route[0] == "drop":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
                self.wfile.flush()
                self.close_connection = True
            elif route[0] == "receiver":
                self._receiver(headers, body, query)
            else:
                self._answer(404)

        def _receiver(self, headers: dict[str, str], body: bytes, query: dict[str, str]) -> None:
            """Honours Idempotency-Key: the work once per key, its result replayed after."""
            key = headers["idempotency-key"]
            with journal.lock:
                first = key not in journal.results
                if first:
                    journal.work[key] = journal.work.get(key, 0) + 1
                    journal.results[key] = {
                        "charged": json.loads(body),
                        "charge": len(journal.work),
                    }
                result = journal.results[key]
            if first and query.get("stall_first") == "1":
                journal.release.wait(30)  # did the work, the answer never comes back
                self.close_connection = True
                return
            self._answer(200, json.dumps(result).encode(), {"Content-Type": "application/json"})

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Journal]]:
    journal = Journal()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(journal))
    httpd.daemon_threads = True
    # A short poll: shutdown() waits for the serving loop's next look (0.5 s by default).
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", journal
    finally:
        journal.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def attempt(key: str = "order-1", *, number: int = 1, redelivery: bool = False) -> Attempt:
    return Attempt(key, "charge", {"order": key, "cents": 1999}, number, redelivery, number)


def send(sink: HttpSink, one: Attempt) -> EffectOutcome:
    async def run() -> EffectOutcome:
        try:
            return await sink(one)
        finally:
            await sink.aclose()

    return asyncio.run(run())


def test_the_payload_goes_as_json_with_the_key_and_the_redelivery_header(
    server: tuple[str, Journal],
) -> None:
    base, journal = server
    sink = HttpSink(f"{base}/json", headers={"Authorization": "Bearer t", "Idempotency-Key": "x"})
    assert send(sink, attempt("order-1")) == Done({"id": 7, "ok": True})
    assert send(sink, attempt("order-1", number=2, redelivery=True)) == Done({"id": 7, "ok": True})
    first, second = journal.on("/json")
    assert first["body"] == second["body"] == {"order": "order-1", "cents": 1999}
    for request in (first, second):
        assert request["headers"]["idempotency-key"] == "order-1"  # the attempt's key wins
        assert request["headers"]["content-type"] == "application/json"
        assert request["headers"]["authorization"] == "Bearer t"
    assert "oncewire-redelivery" not in first["headers"]
    assert first["headers"]["oncewire-attempt"] == "1"
    assert second["headers"]["oncewire-redelivery"] == "1"
    assert second["headers"]["oncewire-attempt"] == "2"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/text", Done("plain words")),
        ("/badjson", Done("{not json")),
        ("/empty", Done(None)),
        ("/status/201", Done("told so")),
    ],
)
def test_a_2xx_is_done_with_its_body(
    server: tuple[str, Journal], path: str, expected: EffectOutcome
) -> None:
    base, journal = server
    assert send(HttpSink(base + path), attempt()) == expected
    assert len(journal.on(path)) == 1


@pytest.mark.parametrize(
    ("status", "query", "kind", "retry_after"),
    [
        (429, "?retry_after=7", NotSent, 7.0),
        (429, "", NotSent, None),
        (503, "?retry_after=12", NotSent, 12.0),
        (408, "", NotSent, None),
        (425, "", NotSent, None),
        (409, "", MaybeSent, None),
        (400, "", Rejected, None),
        (404, "", Rejected, None),
        (422, "", Rejected, None),
        (500, "", MaybeSent, None),
        (502, "", MaybeSent, None),
        (503, "", MaybeSent, None),  # no Retry-After: a 5xx like any other
        (307, "", MaybeSent, None),  # not followed
    ],
)
def test_each_status_becomes_its_outcome(
    server: tuple[str, Journal],
    status: int,
    query: str,
    kind: type,
    retry_after: float | None,
) -> None:
    base, journal = server
    outcome = send(HttpSink(f"{base}/status/{status}{query}"), attempt())
    assert type(outcome) is kind, outcome
    assert f"HTTP {status}" in outcome.reason  # type: ignore[union-attr]
    if isinstance(outcome, NotSent):
        assert outcome.retry_after == retry_after
    assert len(journal.on(f"/status/{status}")) == 1  # one request: the sink never retries


def test_retry_after_as_an_http_date(server: tuple[str, Journal]) -> None:
    base, _ = server
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    outcome = send(HttpSink(f"{base}/status/503?retry_after={when}"), attempt())
    assert isinstance(outcome, NotSent)
    assert outcome.retry_after is not None and 100 < outcome.retry_after <= 120
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    outcome = send(HttpSink(f"{base}/status/429?retry_after={past}"), attempt())
    assert isinstance(outcome, NotSent) and outcome.retry_after == 0.0


@pytest.mark.parametrize(
    "retry_after",
    [
        "99999999999999",  # parked an effect in the year 3,170,900
        "86401",
        "9" * 5000,  # more digits than int() reads
        "Fri, 31 Dec 9999 23:59:59 GMT",
    ],
    ids=["14-digits", "a-day-and-a-second", "5000-digits", "year-9999"],
)
def test_a_retry_after_beyond_the_limit_is_the_limit(
    server: tuple[str, Journal], retry_after: str
) -> None:
    # The server said "later", not "never": the effect is asked again after a day.
    base, _ = server
    for status in (429, 503):
        outcome = send(HttpSink(f"{base}/status/{status}?retry_after={retry_after}"), attempt())
        assert isinstance(outcome, NotSent), outcome
        assert outcome.retry_after == MAX_RETRY_SECONDS


def test_a_retry_after_that_is_not_ascii_digits_is_not_a_wait(server: tuple[str, Journal]) -> None:
    """Regression: ``"²"`` is a digit to ``str.isdigit`` and not to ``int``: the sink raised."""
    base, _ = server
    outcome = send(HttpSink(f"{base}/status/429?retry_after=%C2%B2"), attempt())
    assert outcome == NotSent(outcome.reason) and outcome.retry_after is None  # type: ignore[union-attr]


def test_a_timeout_after_the_request_was_written_is_maybe_sent(
    server: tuple[str, Journal],
) -> None:
    base, journal = server
    outcome = send(HttpSink(f"{base}/stall", timeout_seconds=0.5), attempt())
    assert isinstance(outcome, MaybeSent), outcome
    assert len(journal.on("/stall")) == 1  # it did arrive: "maybe" was the truth


def test_a_connection_dropped_mid_response_is_maybe_sent(server: tuple[str, Journal]) -> None:
    base, journal = server
    outcome = send(HttpSink(f"{base}/drop"), attempt())
    assert isinstance(outcome, MaybeSent), outcome
    assert len(journal.on("/drop")) == 1


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_refused_connection_is_not_sent(closed_port: int) -> None:
    outcome = send(HttpSink(f"http://127.0.0.1:{closed_port}/x"), attempt())
    assert isinstance(outcome, NotSent) and "ConnectError" in outcome.reason


def test_a_name_that_does_not_resolve_is_not_sent() -> None:
    outcome = send(HttpSink("http://oncewire-test.invalid/x"), attempt())
    assert isinstance(outcome, NotSent) and "ConnectError" in outcome.reason


def test_a_connect_timeout_is_not_sent() -> None:
    # A listener that never accepts, its backlog filled: the next SYN is dropped.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(filler)
        try:
            sink = HttpSink(f"http://127.0.0.1:{port}/x", connect_timeout_seconds=0.5)
            outcome = send(sink, attempt())
        finally:
            for filler in fillers:
                filler.close()
    assert isinstance(outcome, NotSent) and "ConnectTimeout" in outcome.reason


def test_a_url_it_cannot_send_to_is_rejected() -> None:
    outcome = send(HttpSink("ftp://127.0.0.1/x"), attempt())
    assert isinstance(outcome, Rejected)


def test_the_url_may_be_a_function_of_the_attempt(server: tuple[str, Journal]) -> None:
    base, journal = server
    sink = HttpSink(lambda a: f"{base}/json?order={a.payload['order']}")
    assert send(sink, attempt("order-3")) == Done({"id": 7, "ok": True})
    assert [r["path"] for r in journal.on("/json")] == ["/json?order=order-3"]


FAST = RetryPolicy(base_seconds=0.05, cap_seconds=0.2)


def test_a_dispatcher_sends_every_effect_once_through_a_pooled_client(
    server: tuple[str, Journal], store_url: str
) -> None:
    base, journal = server
    keys = [f"order-{i}" for i in range(8)]
    sink = HttpSink(f"{base}/receiver")
    with Ledger(store_url) as ledger:
        with ledger.transaction() as tx:
            for key in keys:
                tx.accept(key, "charge", {"order": key})
        Dispatcher(ledger, {"charge": sink}, concurrency=4, retry=FAST).run(
            until_idle=True, handle_signals=False
        )
        effects = [ledger.effects.get(key) for key in keys]
    assert [e.state for e in effects] == [EffectState.DONE] * len(keys)
    assert sorted(r["headers"]["idempotency-key"] for r in journal.on("/receiver")) == keys
    assert journal.work == dict.fromkeys(keys, 1)
    assert sink._client is None  # the dispatcher closed the pool when it stopped


def test_a_redelivery_after_a_timeout_carries_the_key_and_the_work_is_done_once(
    server: tuple[str, Journal], store_url: str
) -> None:
    base, journal = server
    sink = HttpSink(f"{base}/receiver?stall_first=1", timeout_seconds=0.5)
    with Ledger(store_url) as ledger:
        ledger.accept("order-9", "charge", {"order": "order-9"})
        Dispatcher(ledger, {"charge": sink}, retry=FAST).run(until_idle=True, handle_signals=False)
        effect = ledger.effects.get("order-9")
        attempts = ledger.effects.attempts("order-9")
    requests = journal.on("/receiver")
    assert [r["headers"]["idempotency-key"] for r in requests] == ["order-9", "order-9"]
    assert "oncewire-redelivery" not in requests[0]["headers"]
    assert requests[1]["headers"]["oncewire-redelivery"] == "1"
    assert journal.work == {"order-9": 1}
    assert effect.state is EffectState.DONE
    assert json.loads(effect.result_json or "null") == journal.results["order-9"]
    assert [(a.outcome, a.redelivery) for a in attempts] == [
        ("maybe_sent", False),
        ("done", True),
    ]


def test_a_huge_retry_after_parks_the_effect_a_day_and_the_drain_returns(
    server: tuple[str, Journal], store_url: str
) -> None:
    base, journal = server
    sink = HttpSink(f"{base}/status/429?retry_after=99999999999999")
    with Ledger(store_url, clock=ManualClock()) as ledger:  # times to compare exactly
        ledger.accept("order-2", "charge", {"order": "order-2"})
        Dispatcher(ledger, {"charge": sink}).run(until_idle=True, handle_signals=False)
    assert len(journal.on("/status/429")) == 1
    (row,) = RunsDatabase(store_url).query(
        "SELECT state, attempts, fence, not_before, updated_at FROM oncewire_effects"
    )
    assert (row["state"], row["attempts"], row["fence"]) == ("pending", 0, 1)
    assert row["not_before"] == row["updated_at"] + MAX_RETRY_SECONDS


CHILD = """
import sys
from oncewire.dispatch import Dispatcher
from oncewire.ledger import Ledger
from oncewire.sinks import HttpSink

with Ledger(sys.argv[1]) as ledger:
    Dispatcher(ledger, {"charge": HttpSink(sys.argv[2])}, lease_seconds=1.0).run(until_idle=True)
"""


@pytest.mark.crash
def test_a_redelivery_after_a_kill_between_send_and_record_does_the_work_once(
    server: tuple[str, Journal], store_url: str
) -> None:
    base, journal = server
    with Ledger(store_url) as ledger:
        ledger.accept("order-5", "charge", {"order": "order-5"})
    child = _python_child(
        CHILD,
        store_url,
        f"{base}/receiver",
        env=_child_env(**{crash.ENV_POINTS: "dispatch.after_sink_before_record"}),
    )
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, stderr
    assert journal.work == {"order-5": 1}  # sent and done, then killed before the record
    with Ledger(store_url) as ledger:
        assert ledger.effects.get("order-5").state is EffectState.CLAIMED
        claimed = ledger.effects.get("order-5")
        wait_for(
            lambda: time.time() > (claimed.lease_expires_at or 0) + 0.1,
            timeout=30,
            what="the killed dispatcher's lease to end",
        )
        Dispatcher(ledger, {"charge": HttpSink(f"{base}/receiver")}).run(
            until_idle=True, handle_signals=False
        )
        effect = ledger.effects.get("order-5")
        last = ledger.effects.attempts("order-5")[-1]
    requests = journal.on("/receiver")
    assert [r["headers"].get("oncewire-redelivery") for r in requests] == [None, "1"]
    assert {r["headers"]["idempotency-key"] for r in requests} == {"order-5"}
    assert journal.work == {"order-5": 1}  # the redelivery replayed, it did not charge again
    assert effect.state is EffectState.DONE
    assert (last.outcome, last.redelivery) == ("done", True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "FETCH ME"}, "method must be an HTTP method"),
        ({"method": ""}, "method must be an HTTP method"),
        ({"headers": [("X-A", "1")]}, "headers must be a mapping"),
        ({"headers": {"X-A": 1}}, "headers must be a mapping"),
    ],
)
def test_a_sink_that_could_not_send_is_refused_when_built(
    kwargs: dict[str, Any], message: str
) -> None:
    """An invalid method or header would fail inside an attempt, after its claim: refused
    where the sink is made instead."""
    with pytest.raises(ConfigurationError, match=message):
        HttpSink("http://127.0.0.1:9/x", **kwargs)
