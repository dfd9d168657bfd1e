"""Tools in ``oncewire gateway run``, end to end: a tool call is an outbox effect run by the
gateway's dispatcher, its result goes back to the model, and a restart never runs a done tool
again. Real processes only (the fake Bot API, the fake model scripted with tool calls, the
gateway killed with SIGKILL); the tools are a module in the test's directory that appends one
fsynced line per execution, so the executions are counted, not inferred. The store is read
directly: the effects' rows and the turn's run events."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire.inbound import InboundState
from oncewire.storage.records import EffectState
from tests.conftest import _child_env, wait_for
from tests.gateway import test_runner
from tests.gateway.test_runner import Rig, bot_messages, rig, run_events

__all__ = ["rig"]  # the fixture, imported for these tests
pytestmark = pytest.mark.empty_store  # the gateway creates its store

TOOLS_MODULE = """
import json
import os

LOG = {log!r}


def _executed(attempt, tool):
    with open(LOG, "a", encoding="utf-8") as out:
        record = {{"tool": tool, "key": attempt.key, "args": attempt.payload,
                   "redelivery": attempt.redelivery}}
        out.write(json.dumps(record) + "\\n")
        out.flush()
        os.fsync(out.fileno())


def add(attempt):
    _executed(attempt, "add")
    return {{"sum": attempt.payload["a"] + attempt.payload["b"]}}


def broken(attempt):
    _executed(attempt, "broken")
    raise RuntimeError("the disk is on fire")
"""

TOOLS_CONFIG = """
[[tools]]
name = "add"
sink = "gwtools_under_test:add"
schema_file = "add.schema.json"
side_effect = "external"
timeout_seconds = 10

[[tools]]
name = "broken"
sink = "gwtools_under_test:broken"
side_effect = "external"
timeout_seconds = 10
max_attempts = 1
"""

ADD_SCHEMA = {
    "type": "object",
    "description": "Add two integers.",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


@pytest.fixture
def tool_rig(
    rig: Callable[..., Rig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Rig]:
    """``tool_rig(script, db=None)``: the runner's rig with the tools module on PYTHONPATH and
    ``[[tools]]`` in its gateway.toml."""

    def make(script: Any, db: str | None = None) -> Rig:
        r = rig(script, db=db, streaming=False)
        modules = tmp_path / "modules"
        modules.mkdir()
        log = tmp_path / "executions.jsonl"
        (modules / "gwtools_under_test.py").write_text(
            TOOLS_MODULE.format(log=str(log)), encoding="utf-8"
        )
        (tmp_path / "add.schema.json").write_text(json.dumps(ADD_SCHEMA), encoding="utf-8")
        with open(r.config, "a", encoding="utf-8") as config:
            config.write(TOOLS_CONFIG)
        monkeypatch.setenv("PYTHONPATH", str(modules))
        return r

    return make


def executions(r: Rig) -> list[dict[str, Any]]:
    path = r.tmp_path / "executions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def tool_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in request["body"]["messages"] if m["role"] == "tool"]


def test_a_tool_call_runs_once_and_its_result_reaches_the_model(
    tool_rig: Callable[..., Rig], store_url: str
) -> None:
    r = tool_rig(
        [
            {"kind": "tool_call", "name": "add", "args": {"a": 2, "b": 40}},
            {"kind": "text", "text": "2 + 40 is 42."},
        ],
        db=store_url,
    )
    gateway = r.start()
    r.telegram.inject(text="what is 2 + 40?")
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [("2 + 40 is 42.", False)]
    (executed,) = executions(r)
    assert executed == {
        "tool": "add",
        "key": "turn/1/s1/0",
        "args": {"a": 2, "b": 40},
        "redelivery": False,
    }
    first, second = r.model.requests()
    offered = {t["function"]["name"]: t for t in first["body"]["tools"]}
    assert sorted(offered) == ["add", "broken"]
    assert offered["add"]["type"] == "function"
    assert offered["add"]["function"]["parameters"]["required"] == ["a", "b"]
    assert offered["add"]["function"]["description"] == "Add two integers."
    assert tool_messages(first) == []
    assert tool_messages(second) == [
        {"role": "tool", "tool_call_id": "call_0", "content": '{"sum": 42}'}
    ]
    (assistant,) = [m for m in second["body"]["messages"] if m["role"] == "assistant"]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": json.dumps({"a": 2, "b": 40}),
    }
    with r.ledger() as ledger:
        effect = ledger.effects.get("turn/1/s1/0")
        assert (effect.kind, effect.state, effect.attempts) == ("tool.add", EffectState.DONE, 1)
        assert json.loads(effect.payload_json) == {"a": 2, "b": 40}
        assert run_events(ledger, 1) == [
            "run_started",
            "step_recorded",
            "action_proposed",
            "action_resolved",
            "step_recorded",
            "run_terminated",
        ]
        run = ledger.runs.get("turn:1")
        assert run.status == "answered" and run.state["steps"] == 2
        (resolved,) = [e for e in ledger.runs.events("turn:1") if e.type == "action_resolved"]
        assert resolved.payload["request"]["status"] == "succeeded"
        assert resolved.payload["request"]["result"] == {"sum": 42}
        assert all(v.ok for v in ledger.runs.verify())
    assert gateway.terminate() == 0


@pytest.mark.crash
def test_a_done_tool_is_not_run_again_after_a_kill_before_the_next_model_step(
    tool_rig: Callable[..., Rig],
) -> None:
    r = tool_rig(
        [
            {"kind": "tool_call", "name": "add", "args": {"a": 1, "b": 2}, "text": "Adding."},
            {"kind": "hang", "seconds": 600},
            {"kind": "text", "text": "The sum is 3."},
        ]
    )
    first = r.start()
    r.telegram.inject(text="add 1 and 2")
    # The second model request is sent only after the tool's effect is done.
    wait_for(lambda: len(r.model.requests()) == 2, what="the second model request")
    with r.ledger() as ledger:
        assert ledger.effects.get("turn/1/s1/0").state is EffectState.DONE
    first.kill()
    assert len(executions(r)) == 1

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [("The sum is 3.", False)]
    assert len(executions(r)) == 1  # the restart read the result back, it did not run again
    requests = r.model.requests()
    assert len(requests) == 3
    resumed = requests[2]["body"]["messages"]
    assert tool_messages(requests[2]) == [
        {"role": "tool", "tool_call_id": "call_0", "content": '{"sum": 3}'}
    ]
    assert resumed[0] == {"role": "user", "content": "add 1 and 2"}
    assert resumed[1]["role"] == "assistant" and resumed[1]["tool_calls"][0]["id"] == "call_0"
    # What the model said beside its calls is recorded with the step, so the resumed
    # conversation is the one it had, as the first process sent it.
    assert resumed[1]["content"] == "Adding."
    assert resumed[:3] == requests[1]["body"]["messages"][:3]
    assert resumed[2]["role"] == "tool"
    assert "interrupted" in resumed[-1]["content"].lower()  # the resume note comes last
    with r.ledger() as ledger:
        effect = ledger.effects.get("turn/1/s1/0")
        assert (effect.state, effect.attempts) == (EffectState.DONE, 1)
        assert run_events(ledger, 1) == [
            "run_started",
            "step_recorded",
            "action_proposed",
            "action_resolved",
            "run_resumed",
            "step_recorded",
            "run_terminated",
        ]
        assert ledger.runs.get("turn:1").status == "answered"
        assert ledger.inbound.get(1).attempts == 2
    assert second.terminate() == 0


def test_a_tool_whose_sink_raises_is_told_to_the_model_and_the_turn_still_answers(
    tool_rig: Callable[..., Rig],
) -> None:
    r = tool_rig(
        [
            {"kind": "tool_call", "name": "broken", "args": {}},
            {"kind": "text", "text": "I could not tell whether that worked."},
        ]
    )
    gateway = r.start()
    r.telegram.inject(text="use the broken tool")
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [("I could not tell whether that worked.", False)]
    assert [e["tool"] for e in executions(r)] == ["broken"]  # max_attempts = 1
    (told,) = tool_messages(r.model.requests()[1])
    assert told["tool_call_id"] == "call_0"
    assert told["content"].startswith("outcome unknown")
    assert "the disk is on fire" in told["content"]
    with r.ledger() as ledger:
        effect = ledger.effects.get("turn/1/s1/0")
        assert effect.state is EffectState.DEAD and effect.maybe_sent
        events = run_events(ledger, 1)
        # The call stays unresolved: nobody knows whether it happened.
        assert "action_resolved" not in events
        assert events[-1] == "run_terminated"
        run = ledger.runs.get("turn:1")
        assert run.status == "outcome_unknown"
        assert list(run.state["unresolved"]) == ["s1/0"]
        reply = ledger.replies.for_inbound(1)
        assert reply is not None and reply.final_text == "I could not tell whether that worked."
    assert gateway.terminate() == 0


def test_an_unknown_tool_is_an_error_for_the_model_and_nothing_is_dispatched(
    tool_rig: Callable[..., Rig],
) -> None:
    r = tool_rig(
        [
            {
                "kind": "tool_call",
                "calls": [
                    {"name": "rm_rf", "args": {"path": "/"}},
                    {"name": "add", "args": "[1, 2]"},
                ],
            },
            {"kind": "text", "text": "Neither call could run."},
        ]
    )
    gateway = r.start()
    r.telegram.inject(text="clean up")
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [("Neither call could run.", False)]
    assert executions(r) == []
    unknown, not_an_object = tool_messages(r.model.requests()[1])
    assert unknown["tool_call_id"] == "call_0"
    assert unknown["content"].startswith("error: there is no tool named 'rm_rf'")
    assert not_an_object["tool_call_id"] == "call_1"
    assert not_an_object["content"] == "error: the arguments must be a JSON object, not list"
    with r.ledger() as ledger:
        assert ledger.effects.find("turn/1/s1/0") is None
        assert ledger.effects.find("turn/1/s1/1") is None
        resolved = [e for e in ledger.runs.events("turn:1") if e.type == "action_resolved"]
        assert [e.payload["request"]["status"] for e in resolved] == ["failed", "failed"]
        assert ledger.runs.get("turn:1").status == "answered"
    assert gateway.terminate() == 0


def crashing_at(point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next gateway started dies (SIGKILL) at crash point ``point``; later ones do not."""
    armed = {"done": False}

    def child_env(**extra: str) -> dict[str, str]:
        env = _child_env(**extra)
        if not armed["done"]:
            armed["done"] = True
            env["ONCEWIRE_CRASH"] = point
        return env

    monkeypatch.setattr(test_runner, "_child_env", child_env)


@pytest.mark.crash
def test_a_tool_whose_outcome_the_dispatcher_committed_when_killed_is_not_run_again(
    tool_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway dies on its dispatcher's thread right after the tool's outcome committed.
    The turn's thread, woken by that commit, may have read the result and gone on meanwhile
    (recorded it, asked the model for its next step, begun sending the reply), or not: whatever
    the first process got to, the restart never runs the tool again, and the answer shows once
    (a copy only where a send of it may have landed, and marked). The turn held between the
    outcome and its record every time is test_gateway_crash_points' tool_done_before_resolve."""
    answer = {"kind": "text", "text": "The sum is 42."}
    r = tool_rig(
        {
            "responses": [{"kind": "tool_call", "name": "add", "args": {"a": 20, "b": 22}}, answer],
            "default": answer,  # the final step asked again, if the first process asked it
        }
    )
    crashing_at("dispatch.after_record", monkeypatch)
    first = r.start()
    r.telegram.inject(text="add 20 and 22")
    first.process.wait(timeout=30)  # killed right after the tool's outcome was committed
    first.kill()
    proposed = ["run_started", "step_recorded", "action_proposed"]
    rest = ["action_resolved", "step_recorded", "run_terminated"]
    with r.ledger() as ledger:
        assert ledger.effects.get("turn/1/s1/0").state is EffectState.DONE
        got = run_events(ledger, 1)
    assert got[:3] == proposed and got[3:] == rest[: len(got) - 3], got
    if got == proposed:  # the turn had not taken the result: nor asked the model again
        assert len(r.model.requests()) == 1
    assert len(executions(r)) == 1

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    shown = bot_messages(r)
    assert [text for text, _ in shown] == ["The sum is 42."] * len(shown) and shown, shown
    assert [marked for _, marked in shown].count(False) <= 1, shown
    if "run_terminated" not in got:  # no send of the reply had begun: shown once, unmarked
        assert shown == [("The sum is 42.", False)]
    assert len(executions(r)) == 1
    assert tool_messages(r.model.requests()[1]) == [
        {"role": "tool", "tool_call_id": "call_0", "content": '{"sum": 42}'}
    ]
    with r.ledger() as ledger:
        events = run_events(ledger, 1)
        effect = ledger.effects.get("turn/1/s1/0")
        assert (effect.state, effect.attempts) == (EffectState.DONE, 1)
        assert events[: len(got)] == got
        assert events.count("action_resolved") == 1
        assert events[-1] == "run_terminated"
        assert ("run_resumed" in events) == ("run_terminated" not in got), events
        assert ledger.runs.get("turn:1").status == "answered"
    assert second.terminate() == 0


@pytest.mark.crash
def test_a_tool_killed_before_its_outcome_was_recorded_is_redelivered_flagged(
    tool_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = tool_rig(
        [
            {"kind": "tool_call", "name": "add", "args": {"a": 5, "b": 5}},
            {"kind": "text", "text": "The sum is 10."},
        ]
    )
    crashing_at("dispatch.after_sink_before_record", monkeypatch)
    first = r.start()
    r.telegram.inject(text="add 5 and 5")
    first.process.wait(timeout=30)  # killed after the sink ran, before its outcome was stored
    first.kill()
    with r.ledger() as ledger:
        assert ledger.effects.get("turn/1/s1/0").state is EffectState.CLAIMED

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [("The sum is 10.", False)]
    # The sink may have acted: the dispatcher asks it again, saying so.
    assert [e["redelivery"] for e in executions(r)] == [False, True]
    with r.ledger() as ledger:
        effect = ledger.effects.get("turn/1/s1/0")
        assert effect.state is EffectState.DONE and effect.maybe_sent
        assert ledger.runs.get("turn:1").status == "answered"
    assert second.terminate() == 0


def test_a_turn_that_keeps_calling_tools_stops_at_max_steps_and_says_so(
    tool_rig: Callable[..., Rig],
) -> None:
    call = {"kind": "tool_call", "name": "add", "args": {"a": 1, "b": 1}, "text": "Again."}
    r = tool_rig({"responses": [], "default": call})
    text = r.config.read_text(encoding="utf-8")
    r.config.write_text(text.replace("max_concurrent = 2", "max_concurrent = 2\nmax_steps = 2"))
    gateway = r.start()
    r.telegram.inject(text="loop for ever")
    r.wait_status(1, InboundState.DELIVERED)
    ((shown, _),) = bot_messages(r)
    assert shown.startswith("Again.\n\n(I stopped after 2 steps")
    assert len(executions(r)) == 1  # the second step's call was recorded, never run
    assert len(r.model.requests()) == 2
    with r.ledger() as ledger:
        run = ledger.runs.get("turn:1")
        assert (run.status, run.state["steps"]) == ("answered", 2)
        assert ledger.effects.find("turn/1/s2/0") is None
    assert gateway.terminate() == 0


@pytest.mark.crash
def test_a_call_of_a_tool_no_longer_configured_is_cancelled_and_the_turn_answers(
    tool_rig: Callable[..., Rig], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = tool_rig(
        [
            {"kind": "tool_call", "name": "add", "args": {"a": 1, "b": 1}},
            {"kind": "text", "text": "I do not know whether it ran."},
        ]
    )
    crashing_at("dispatch.after_claim", monkeypatch)
    first = r.start()
    r.telegram.inject(text="add 1 and 1")
    first.process.wait(timeout=30)  # killed with the call claimed, its sink not called
    first.kill()
    config = r.config.read_text(encoding="utf-8")
    r.config.write_text(config[: config.index("[[tools]]")], encoding="utf-8")

    second = r.start()
    r.wait_status(1, InboundState.DELIVERED)
    assert bot_messages(r) == [("I do not know whether it ran.", False)]
    assert executions(r) == []
    (told,) = tool_messages(r.model.requests()[1])
    assert told["content"].startswith("outcome unknown")
    assert "not configured" in told["content"]
    assert "tools" not in r.model.requests()[1]["body"]  # nothing is offered any more
    with r.ledger() as ledger:
        effect = ledger.effects.get("turn/1/s1/0")
        # Claimed by a process that died: nobody can say the sink was not called.
        assert effect.state is EffectState.CANCELLED and effect.maybe_sent
        assert ledger.runs.get("turn:1").status == "outcome_unknown"
    assert second.terminate() == 0
