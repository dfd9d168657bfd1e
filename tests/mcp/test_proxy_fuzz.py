"""The proxy's stdin fuzzed with raw lines (the one place a test writes JSON-RPC by hand: the
point is what no SDK client would send): each line it cannot use is answered with a clear
JSON-RPC error, with the request's id when the line has a usable one; nothing is recorded or
forwarded for it, and the proxy goes on serving a real call afterwards.

The tests share one proxy (per backend and test worker): each case checks its answer and that
the store and the server's log did not change, and each test reads only what it added. What the
proxy does with a line does not depend on the store: SQLite by default, both under ``--soak``."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from tests.mcp.conftest import ROOT, Raw, calls_logged, child_env, proxy_argv
from tests.support.pg import fresh_schema, server_url

HUGE = 10**40


class RawPeer:
    """The proxy as a child process, spoken to one line at a time."""

    def __init__(self, db: str, log: Path) -> None:
        self.process = subprocess.Popen(
            proxy_argv(db),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=child_env(log),
            cwd=str(ROOT),
        )
        self.lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def send(self, line: bytes | str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() if isinstance(line, str) else line)
        self.process.stdin.write(b"\n")
        self.process.stdin.flush()

    def send_json(self, message: dict[str, Any]) -> None:
        self.send(json.dumps(message))

    def receive(self, timeout: float = 20.0) -> dict[str, Any]:
        value = json.loads(self.lines.get(timeout=timeout))
        assert isinstance(value, dict)
        return value

    def answer_to(self, request_id: Any) -> dict[str, Any]:
        """The next response, which must answer ``request_id`` (server notifications skipped)."""
        while True:
            message = self.receive()
            if "method" in message:
                continue
            assert message.get("id") == request_id and type(message["id"]) is type(request_id)
            return message

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        finally:
            assert self.process.stdout is not None
            self.process.stdout.close()


def _call(request_id: Any, params: Any = None, **extra: Any) -> str:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call"}
    if params is not None:
        message["params"] = params
    message.update(extra)
    return json.dumps(message)


# (line, the id the error must carry, the error code)
REFUSED: list[tuple[bytes | str, Any, int]] = [
    ("this is not json", None, -32700),
    (b"\xff\xfe{not utf-8}", None, -32700),
    ("[" * 100_000 + "]" * 100_000, None, -32700),
    ('{"jsonrpc": "2.0", "id": ' + "9" * 5000 + ', "method": "ping"}', None, -32700),
    ("[]", None, -32600),
    ('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', None, -32600),
    ("42", None, -32600),
    ('"tools/call"', None, -32600),
    ('{"jsonrpc": "1.0", "id": 7, "method": "ping"}', 7, -32600),
    ('{"jsonrpc": "2.0", "id": 1.5, "method": "tools/call"}', None, -32600),
    ('{"jsonrpc": "2.0", "id": true, "method": "tools/call"}', None, -32600),
    ('{"jsonrpc": "2.0", "id": null, "method": "tools/call", "params": {}}', None, -32600),
    ('{"jsonrpc": "2.0", "id": 8, "method": 5}', 8, -32600),
    ('{"jsonrpc": "2.0", "id": 9}', 9, -32600),
    (_call(10, [1, 2]), 10, -32600),
    (_call(HUGE), HUGE, -32602),  # tools/call without params
    (_call(-HUGE, {}), -HUGE, -32602),  # no name
    (_call("s-1", {"name": ""}), "s-1", -32602),
    (_call("s-2", {"name": "charge", "arguments": "amount=5"}), "s-2", -32602),
    (_call("s-3", {"name": "charge", "arguments": [5]}), "s-3", -32602),
    (_call("s-4", {"name": "charge", "arguments": {}, "_meta": []}), "s-4", -32602),
    (
        _call(
            "s-5", {"name": "charge", "arguments": {}, "_meta": {"io.oncewire/idempotency-key": 5}}
        ),
        "s-5",
        -32602,
    ),
    (_call("s-6", {"name": "charge", "arguments": {}, "idempotencyKey": ""}), "s-6", -32602),
    (
        _call(
            "s-7",
            {
                "name": "charge",
                "arguments": {},
                "_meta": {"io.oncewire/idempotency-key": "k" * 100_000},
            },
        ),
        "s-7",
        -32602,
    ),
    (
        _call(
            "s-8", {"name": "charge", "arguments": {"amount": 5}, "idempotencyKey": "bad\u0000key"}
        ),
        "s-8",
        -32602,
    ),
]


@dataclass
class Fuzzed:
    """The shared proxy, its store, its server's log, and where the store and log stood when
    the test started."""

    peer: RawPeer
    raw: Raw
    log: Path
    first_id: int = 0
    first_call: int = 0

    def effects(self) -> list[dict[str, Any]]:
        return self.raw.effects(self.first_id)

    def calls(self) -> list[dict[str, Any]]:
        return calls_logged(self.log)[self.first_call :]


@pytest.fixture(
    scope="module",
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)],
)
def fuzz_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path_factory.mktemp("fuzz") / "proxy.db")
        return
    with fresh_schema(server_url(), "mcp") as url:
        yield url


@pytest.fixture(scope="module")
def shared_peer(fuzz_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    Ledger(fuzz_url).close()  # the schema exists before the tests read it
    log = tmp_path_factory.mktemp("fuzz-log") / "upstream.log"
    handle = RawPeer(fuzz_url, log)
    raw = Raw(fuzz_url)
    try:
        handle.send_json(
            {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "fuzz", "version": "0"},
                },
            }
        )
        assert "result" in handle.answer_to(0)
        handle.send_json({"jsonrpc": "2.0", "method": "notifications/initialized"})
        yield Fuzzed(handle, raw, log)
    finally:
        raw.close()
        handle.close()


@pytest.fixture
def fuzzed(shared_peer: Fuzzed) -> Fuzzed:
    shared_peer.first_id = shared_peer.raw.last_id()
    shared_peer.first_call = len(calls_logged(shared_peer.log))
    return shared_peer


def test_every_unusable_line_gets_a_clear_error_and_the_proxy_goes_on_serving(
    fuzzed: Fuzzed,
) -> None:
    peer = fuzzed.peer
    for line, request_id, code in REFUSED:
        peer.send(line)
        answer = peer.answer_to(request_id)
        assert answer["error"]["code"] == code, (line[:80], answer)
        assert answer["error"]["message"], answer
        assert fuzzed.effects() == [], line[:80]
        assert fuzzed.calls() == [], line[:80]

    # Relayed as they are: the server answers (an unknown method) or ignores them.
    peer.send_json({"jsonrpc": "2.0", "id": "u-1", "method": "no/such/method"})
    assert peer.answer_to("u-1")["error"]["code"] == -32601
    peer.send_json({"jsonrpc": "2.0", "method": "notifications/no-such-thing"})
    peer.send_json({"jsonrpc": "2.0", "id": 4242, "result": {}})  # answers nothing asked
    peer.send_json({"jsonrpc": "2.0", "id": HUGE, "method": "ping"})
    assert peer.answer_to(HUGE)["result"] == {}

    assert fuzzed.effects() == []
    assert fuzzed.calls() == []

    peer.send(
        _call(
            "real",
            {
                "name": "charge",
                "arguments": {"amount": 5},
                "_meta": {"io.oncewire/idempotency-key": "ok-1"},
            },
        )
    )
    answer = peer.answer_to("real")
    assert answer["result"]["content"][0]["text"] == "charged 5"
    assert [e["key"] for e in fuzzed.effects()] == ["ok-1"]
    assert len(fuzzed.calls()) == 1
    assert peer.process.poll() is None


def test_the_sep_3182_idempotency_key_is_read_as_the_key(fuzzed: Fuzzed) -> None:
    peer = fuzzed.peer
    for request_id in ("sep-a", "sep-b"):  # a retry under another JSON-RPC id: the same call
        params = {"name": "charge", "arguments": {"amount": 2}, "idempotencyKey": "sep-1"}
        peer.send(_call(request_id, params))
        answer = peer.answer_to(request_id)
        assert answer["result"]["content"][0]["text"] == "charged 2"
    assert [e["key"] for e in fuzzed.effects()] == ["sep-1"]
    assert [(c["key"], c["redelivery"]) for c in fuzzed.calls()] == [("sep-1", False)]


def test_a_cancellation_for_no_request_in_flight_is_dropped_not_relayed(fuzzed: Fuzzed) -> None:
    """The proxy numbers the requests it relays in its own sequence. A cancellation naming a
    request not in flight here (answered already, or never sent) is dropped: relayed as it came,
    its id would name whichever relayed request has that number, and cancel it."""
    peer = fuzzed.peer
    get = {"name": "unhurried", "arguments": {"seconds": "1.5"}}
    peer.send_json({"jsonrpc": "2.0", "id": "slow", "method": "prompts/get", "params": get})
    for stale in range(0, 200):  # every number the proxy's own sequence can have reached
        peer.send_json(
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": stale}}
        )
    answer = peer.answer_to("slow")
    assert answer["result"]["messages"][0]["content"]["text"] == "taken my time", answer
    assert peer.process.poll() is None


def test_a_call_resent_under_its_id_while_in_flight_is_answered_once(fuzzed: Fuzzed) -> None:
    """The same tools/call again under the id of one in flight (no key: the proxy's key is the
    session and that id) gets the one answer; another tools/call under that id is refused with
    an error whose id is null, nothing recorded or forwarded for it."""
    peer = fuzzed.peer
    slow = _call("dup", {"name": "slow", "arguments": {"seconds": 1.5}})
    peer.send(slow)
    for _ in range(3):
        peer.send(slow)
    peer.send(_call("dup", {"name": "charge", "arguments": {"amount": 1}}))
    refused = peer.answer_to(None)
    assert refused["error"]["code"] == -32600
    assert 'request id "dup"' in refused["error"]["message"]
    assert "nothing was recorded or forwarded" in refused["error"]["message"]
    answer = peer.answer_to("dup")
    assert answer["result"]["content"][0]["text"] == "slow done"
    peer.send(_call("after", {"name": "lookup", "arguments": {"q": "next"}}))
    assert peer.answer_to("after")["result"]["content"][0]["text"] == "found next"
    [effect] = fuzzed.effects()
    assert (effect["payload"]["tool"], effect["state"]) == ("slow", "done")
    assert [c["tool"] for c in fuzzed.calls()] == ["slow", "lookup"]
