"""oncewire.toolcalls on a real SQLite file and a real PostgreSQL server, with a real Dispatcher:
one effect per tool_call.id keyed per turn, accepted with the caller's rows, and what the model
is told read from the store. Effects and rows are read around oncewire."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from oncewire import Attempt, Dispatcher, Ledger, Rejected, toolcalls
from tests.support import tables


def sdk_call(call_id: str, name: str, arguments: str) -> Any:
    """A tool call shaped like the OpenAI SDK's objects."""
    return SimpleNamespace(
        id=call_id, type="function", function=SimpleNamespace(name=name, arguments=arguments)
    )


class Tools:
    """The sinks, counting each call by key (what the world saw)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def weather(self, attempt: Attempt) -> Any:
        with self.lock:
            self.calls.append(attempt.key)
        return {"city": attempt.payload["city"], "sky": "clear"}

    def refund(self, attempt: Attempt) -> Any:
        with self.lock:
            self.calls.append(attempt.key)
        return Rejected(f"refunds over 100 need a human (asked {attempt.payload['amount']})")

    def charge(self, attempt: Attempt) -> Any:
        with self.lock:
            self.calls.append(attempt.key)
        raise ConnectionResetError("the connection dropped after the request was sent")

    def sinks(self) -> dict[str, Any]:
        return {
            "tool.weather": self.weather,
            "tool.refund": self.refund,
            "tool.charge": self.charge,
        }


@pytest.fixture
def dispatching(store_url: str) -> Iterator[tuple[Ledger, Tools]]:
    tools = Tools()
    with Ledger(store_url) as ledger:
        with ledger.transaction() as tx:
            tx.execute("CREATE TABLE turns (id TEXT PRIMARY KEY, response TEXT NOT NULL)")
        dispatcher = Dispatcher(ledger, tools.sinks(), poll_seconds=0.05)
        thread = threading.Thread(target=dispatcher.run, kwargs={"handle_signals": False})
        thread.start()
        try:
            yield ledger, tools
        finally:
            dispatcher.stop()
            thread.join(timeout=60)
    assert not thread.is_alive()


def test_each_call_is_one_effect_accepted_with_the_turn_and_answered_from_the_store(
    store_url: str, dispatching: tuple[Ledger, Tools]
) -> None:
    ledger, tools = dispatching
    response = [
        sdk_call("call_a", "weather", '{"city": "Oslo"}'),
        {
            "id": "call_b",
            "type": "function",
            "function": {"name": "refund", "arguments": '{"amount": 500}'},
        },
        sdk_call("call_c", "charge", '{"amount": 5}'),
        sdk_call("call_d", "weather", "Oslo"),  # not JSON: no effect
    ]
    with ledger.transaction() as tx:
        tx.execute(
            "INSERT INTO turns (id, response) VALUES (:id, :response)",
            {"id": "turn-1", "response": "asked for 4 tools"},
        )
        accepted = toolcalls.accept_in_tx(tx, "turn-1", response, max_attempts=1)
    assert [a.key for a in accepted] == [
        "turn-1/call_a",
        "turn-1/call_b",
        "turn-1/call_c",
        "turn-1/call_d",
    ]
    messages = toolcalls.results(ledger, accepted, wait_seconds=60)

    stored = tables.rows(
        store_url, "SELECT key, kind, payload, state FROM oncewire_effects ORDER BY key"
    )
    assert [(k, kind, json.loads(p), s) for k, kind, p, s in stored] == [
        ("turn-1/call_a", "tool.weather", {"city": "Oslo"}, "done"),
        ("turn-1/call_b", "tool.refund", {"amount": 500}, "rejected"),
        ("turn-1/call_c", "tool.charge", {"amount": 5}, "dead"),
    ]
    assert tables.rows(store_url, "SELECT id FROM turns") == [("turn-1",)]
    assert sorted(tools.calls) == ["turn-1/call_a", "turn-1/call_b", "turn-1/call_c"]
    assert [m["tool_call_id"] for m in messages] == ["call_a", "call_b", "call_c", "call_d"]
    assert {m["role"] for m in messages} == {"tool"}
    assert json.loads(messages[0]["content"]) == {"city": "Oslo", "sky": "clear"}
    assert messages[1]["content"].startswith("error: the tool refused the call: refunds over 100")
    assert messages[2]["content"].startswith(toolcalls.UNKNOWN_OUTCOME)
    assert "the connection dropped" in messages[2]["content"]
    assert messages[3]["content"].startswith("error: the arguments are not valid JSON")

    # The turn retried (a crash after the commit, a replayed request): the same effects are
    # found, nothing runs again, and the model is told the same.
    again = toolcalls.call(ledger, "turn-1", response[:3], max_attempts=1, wait_seconds=60)
    assert again == messages[:3]
    assert tables.rows(store_url, "SELECT COUNT(*) FROM oncewire_effects") == [(3,)]
    assert sorted(tools.calls) == ["turn-1/call_a", "turn-1/call_b", "turn-1/call_c"]


def test_a_rolled_back_turn_leaves_no_effect(store_url: str) -> None:
    with Ledger(store_url) as ledger, pytest.raises(RuntimeError), ledger.transaction() as tx:
        toolcalls.accept_in_tx(tx, "turn-2", [sdk_call("call_x", "weather", "{}")])
        raise RuntimeError("the model response could not be recorded")
    assert tables.rows(store_url, "SELECT COUNT(*) FROM oncewire_effects") == [(0,)]


def test_a_call_cancelled_before_it_ran_did_not_run_and_a_wait_can_end(store_url: str) -> None:
    with Ledger(store_url) as ledger:
        with ledger.transaction() as tx:
            accepted = toolcalls.accept_in_tx(tx, "turn-3", [sdk_call("call_y", "weather", "{}")])
        with pytest.raises(toolcalls.ToolCallPending) as waited:
            toolcalls.results(ledger, accepted, wait_seconds=0.2, poll_seconds=0.05)
        assert waited.value.key == "turn-3/call_y"
        ledger.effects.cancel("turn-3/call_y", reason="the user withdrew the request")
        (message,) = toolcalls.results(ledger, accepted, wait_seconds=10)
    assert tables.rows(store_url, "SELECT state FROM oncewire_effects") == [("cancelled",)]
    assert message["content"] == ("error: the tool did not run: the user withdrew the request")


# Regression: a dict where the list of tool calls belongs (one call's dict form, or the whole
# message) was iterated by its keys and raised AttributeError: 'str' object has no attribute
# 'function'. Anything that is not a list of tool calls is a TypeError naming what it expects,
# before any effect is accepted.
ONE_CALL = {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
NOT_A_LIST: dict[str, tuple[Any, str]] = {
    "one-call-dict": (ONE_CALL, "not a dict; for one call, pass [call]"),
    "message-dict": ({"role": "assistant", "tool_calls": [ONE_CALL]}, "not a dict"),
    "string": ('[{"id": "call_a"}]', "not a str"),
    "none": (None, "not a NoneType"),
}
NOT_A_CALL: dict[str, tuple[Any, str]] = {
    "string-item": ("call_b", "tool_calls[1] is a str"),
    "none-item": (None, "tool_calls[1] is a NoneType"),
    "function-not-a-dict": ({"id": "call_b", "function": "weather"}, "tool_calls[1].function"),
    "object-without-function": (SimpleNamespace(id="call_b"), "tool_calls[1] is a SimpleNamespace"),
}


def _refused_and_nothing_stored(url: str, tool_calls: Any, message: str) -> None:
    with Ledger(url) as ledger:
        with ledger.transaction() as tx:
            tx.execute("CREATE TABLE turns (id TEXT PRIMARY KEY)")
        with ledger.transaction() as tx:
            with pytest.raises(TypeError) as caught:
                toolcalls.accept_in_tx(tx, "turn-9", tool_calls)
            # The caller caught it and committed its own row: no effect went with it.
            tx.execute("INSERT INTO turns (id) VALUES (:id)", {"id": "turn-9"})
    assert message in str(caught.value), str(caught.value)
    assert "accept_in_tx" in str(caught.value)
    assert tables.rows(url, "SELECT COUNT(*) FROM oncewire_effects") == [(0,)]
    assert tables.rows(url, "SELECT id FROM turns") == [("turn-9",)]


@pytest.mark.parametrize("case", sorted(NOT_A_LIST))
def test_tool_calls_that_are_not_a_list_are_a_type_error_and_store_nothing(
    store_url: str, case: str
) -> None:
    tool_calls, message = NOT_A_LIST[case]
    _refused_and_nothing_stored(store_url, tool_calls, message)


@pytest.mark.parametrize("case", sorted(NOT_A_CALL))
def test_an_item_that_is_not_a_tool_call_is_a_type_error_and_stores_nothing(
    store_url: str, case: str
) -> None:
    item, message = NOT_A_CALL[case]
    _refused_and_nothing_stored(store_url, [ONE_CALL, item], message)


def test_a_transaction_that_is_not_the_ledgers_is_a_type_error() -> None:
    expected = r"LedgerTransaction of `with ledger\.transaction\(\) as tx`, not a dict"
    with pytest.raises(TypeError, match=expected):
        toolcalls.accept_in_tx({"db": "app.db"}, "turn-9", [ONE_CALL])  # type: ignore[arg-type]
