"""The turn preset's pure logic: its table, guards, session names and recovery plan. No I/O."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.runs import TurnSession, TurnState
from oncewire.runs.machine import NEW, Refusal, Step, apply_command
from oncewire.runs.records import Run
from oncewire.runs.turn import TURN, TURN_TERMINAL, action_id, effect_key, run_id, text_sha256
from oncewire.runs.turn.recovery import recovery_plan

H = "a" * 64
CALL = {"id": "call-1", "name": "terminal"}


class Turn:
    """Drives the turn preset in memory, as the service and the verifier do."""

    def __init__(self, inbound: int = 7, session: TurnSession | None = None) -> None:
        self.state: dict[str, Any] = {"status": NEW}
        self.seq = 0
        self.inbound = inbound
        self.session = session or TurnSession("telegram", "bot", "chat")

    def __call__(self, command: str, *, run: str | None = None, **request: Any) -> Any:
        self.seq += 1
        step = Step(run or run_id(self.inbound), self.seq, float(self.seq), None)
        return apply_command(TURN, self.state, command, request, step)

    def start(self, **override: Any) -> Turn:
        request: dict[str, Any] = {
            "workflow": "turn",
            "scope": self.session.scope,
            "branch": self.session.branch,
            "turn": str(self.inbound),
            "params": {"inbound": self.inbound, "session": self.session.as_dict()},
        }
        request.update(override)
        self("start", **request)
        return self

    def step(self, number: int, *calls: dict[str, Any]) -> Turn:
        self(
            "record_step",
            step=number,
            request_digest=H,
            response_digest=H,
            usage={},
            finish_reason="stop",
            tool_calls=list(calls),
        )
        return self

    def propose(self, step: int = 1, index: int = 0, cls: str = "external", **kw: Any) -> Turn:
        request = {
            "action_id": action_id(step, index),
            "step": step,
            "index": index,
            "tool_call_id": CALL["id"],
            "kind": CALL["name"],
            "arguments": {},
            "side_effect_class": cls,
            "resource_keys": [],
            "effect_key": effect_key(self.inbound, step, index),
        }
        request.update(kw)
        self("propose_action", **request)
        return self

    def terminate(self, status: str, reply: str | None = None) -> Turn:
        self("terminate", status=status, reason="r", reply_sha256=reply)
        return self


def test_the_table_is_declarative_and_complete() -> None:
    rows = TURN.describe()
    assert {row["command"] for row in rows} == set(TURN.commands())
    assert set(TURN.commands()) == {
        "start",
        "record_step",
        "steer",
        "propose_action",
        "resolve_action",
        "request_interrupt",
        "resume",
        "terminate",
        "abandon",
    }
    assert [row["event"] for row in rows if row["terminal"]] == ["run_terminated"]
    assert TURN.terminal_statuses == {
        "answered",
        "interrupted",
        "failed",
        "outcome_unknown",
        "cancelled",
    }
    assert {str(s) for s in TURN_TERMINAL} == TURN.terminal_statuses
    assert len(TURN.by_event) == len(TURN.transitions)


def test_a_session_names_its_scope_and_branch_without_ambiguity() -> None:
    chat = TurnSession("telegram", "bot", "-100")
    assert (chat.scope, chat.branch) == ("telegram/bot/-100", "telegram/bot/-100")
    thread = TurnSession("telegram", "bot", "-100", thread="17")
    assert (thread.scope, thread.branch) == ("telegram/bot/-100", "telegram/bot/-100/17")
    # A "/" or "%" inside an id never makes two sessions share a name.
    assert TurnSession("p", "a/b", "c").scope != TurnSession("p", "a", "b/c").scope
    assert TurnSession("p", "a", "b/c").scope == "p/a/b%2Fc"
    assert TurnSession("p", "a", "b%2Fc").scope == "p/a/b%252Fc"
    assert TurnSession("p", "a", "b", "c/d").branch != TurnSession("p", "a", "b/c", "d").branch


def test_names_of_a_turn_its_calls_and_their_effects() -> None:
    assert run_id(7) == "turn:7"
    assert action_id(3, 0) == "s3/0"
    assert effect_key(7, 3, 1) == "turn/7/s3/1"
    assert text_sha256("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert text_sha256("é") == hashlib.sha256(b"\xc3\xa9").hexdigest()  # the UTF-8 bytes


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ({"scope": "other"}, "session's scope"),
        ({"turn": "8"}, "inbound id"),
        ({"params": {"inbound": 0, "session": {}}}, "positive integer"),
        ({"params": {"inbound": True, "session": {}}}, "positive integer"),
        ({"params": {"inbound": 7, "session": {"platform": "p"}}}, "params.session"),
        (
            {
                "params": {
                    "inbound": 7,
                    "session": {"platform": "", "bot": "b", "chat": "c", "thread": ""},
                }
            },
            "platform",
        ),
    ],
)
def test_a_turn_starts_only_on_its_session_under_its_inbound(
    override: dict[str, Any], why: str
) -> None:
    with pytest.raises(Refusal, match=why):
        Turn().start(**override)


def test_the_run_id_is_the_inbound_turn() -> None:
    turn = Turn()
    with pytest.raises(Refusal, match="is run 'turn:7'"):
        turn(
            "start",
            run="turn:8",
            workflow="turn",
            scope=turn.session.scope,
            branch=turn.session.branch,
            turn="7",
            params={"inbound": 7, "session": turn.session.as_dict()},
        )


def test_steps_are_numbered_without_a_gap_and_well_formed() -> None:
    turn = Turn().start().step(1)
    with pytest.raises(Refusal, match="next step is 2"):
        turn.step(3)
    with pytest.raises(Refusal, match="next step is 2"):
        turn.step(1)
    with pytest.raises(Refusal, match="distinct"):
        turn.step(2, CALL, CALL)
    with pytest.raises(Refusal, match="id and name"):
        turn.step(2, {"id": "x"})
    with pytest.raises(Refusal, match="sha256"):
        turn("record_step", step=2, request_digest="A" * 64, response_digest=H, usage={},
             finish_reason="stop", tool_calls=[])  # fmt: skip
    assert turn.step(2, CALL).state["steps"] == 2


def test_a_tool_call_binds_to_the_latest_step_that_asked_for_it() -> None:
    turn = Turn().start().step(1, CALL)
    with pytest.raises(Refusal, match="tool call 0 is 'terminal'"):
        turn.propose(kind="rm")
    with pytest.raises(Refusal, match="no index 1"):
        turn.propose(index=1, action_id="s1/1")
    with pytest.raises(Refusal, match="effect key is 'turn/7/s1/0'"):
        turn.propose(effect_key="turn/8/s1/0")
    with pytest.raises(Refusal, match="action id"):
        turn.propose(action_id="mine")
    turn.propose(effect_key=None)  # a call run without the outbox records no effect
    with pytest.raises(Refusal, match="already proposed"):
        turn.propose()
    turn.step(2, CALL)
    with pytest.raises(Refusal, match="latest recorded step"):
        turn.propose(step=1, index=0, action_id="s1/0")


def test_an_interrupt_leaves_only_settling_and_a_terminal() -> None:
    turn = Turn().start().step(1, CALL).propose()
    turn("request_interrupt", by=8, reason="new_message")
    assert turn.state["status"] == TurnState.INTERRUPTING
    for command, request in [
        ("record_step", {"step": 2}),
        ("propose_action", {}),
        ("steer", {"inbound": 9, "after_step": 1}),
        ("request_interrupt", {"by": 9, "reason": "again"}),
    ]:
        with pytest.raises(Refusal, match="not allowed from interrupting"):
            turn(command, **request)
    turn("resolve_action", action_id="s1/0", status="succeeded", result=None)
    with pytest.raises(Refusal, match="interrupted before its answer"):
        turn.terminate("answered", H)
    turn.terminate("interrupted")
    assert turn.state["status"] == "interrupted" and turn.state["finished_at"] is not None


def test_answered_needs_the_reply_digest_and_interrupted_needs_an_interrupt() -> None:
    turn = Turn().start().step(1)
    with pytest.raises(Refusal, match="reply_sha256"):
        turn.terminate("answered")
    with pytest.raises(Refusal, match="sha256 hex digest"):
        turn.terminate("answered", "not-a-digest")
    with pytest.raises(Refusal, match="recorded interrupt"):
        turn.terminate("interrupted")
    with pytest.raises(Refusal, match="not a turn's terminal"):
        turn.terminate("verified")
    turn.terminate("answered", H)
    assert turn.state["reply_sha256"] == H
    with pytest.raises(Refusal, match="not allowed from answered"):
        turn.terminate("failed")


@pytest.mark.parametrize("status", ["answered", "failed", "cancelled", "interrupted"])
def test_only_outcome_unknown_ends_a_turn_with_an_unresolved_world_changing_call(
    status: str,
) -> None:
    turn = Turn().start().step(1, CALL).propose()
    if status == "interrupted":
        turn("request_interrupt", by=None, reason="stop")
    with pytest.raises(Refusal, match="outcome is unknown"):
        turn.terminate(status, H)
    turn.terminate("outcome_unknown")
    assert turn.state["status"] == "outcome_unknown"


def test_a_read_only_call_unresolved_does_not_hold_the_answer() -> None:
    turn = Turn().start().step(1, CALL).propose(cls="read_only")
    turn.terminate("answered", H)
    assert turn.state["unresolved"] == {"s1/0": {"class": "read_only", "effect_key": "turn/7/s1/0"}}


def test_a_takeover_moves_the_recorded_fence_one_at_a_time() -> None:
    turn = Turn().start()
    with pytest.raises(Refusal, match="from 1 to 2"):
        turn("resume", owner="w2", from_fence=1, fence=3, reason="restart")
    with pytest.raises(Refusal, match="from 1 to 2"):
        turn("resume", owner="w2", from_fence=2, fence=3, reason="restart")
    turn("resume", owner="w2", from_fence=1, fence=2, reason="restart")
    turn("resume", owner="w3", from_fence=2, fence=3, reason="restart")
    assert (turn.state["fence"], turn.state["resumes"]) == (3, 2)


def test_a_steer_lands_after_the_latest_step_once_per_inbound() -> None:
    turn = Turn().start()
    turn("steer", inbound=8, after_step=0)  # before the first model answer
    with pytest.raises(Refusal, match="already steered"):
        turn("steer", inbound=8, after_step=0)
    with pytest.raises(Refusal, match="another inbound"):
        turn("steer", inbound=7, after_step=0)
    turn.step(1)
    with pytest.raises(Refusal, match="latest recorded step"):
        turn("steer", inbound=9, after_step=0)


def test_after_abandon_nothing_follows() -> None:
    turn = Turn().start()
    turn("abandon", reason="gone")
    assert turn.state["status"] == "running"
    with pytest.raises(Refusal, match="abandoned"):
        turn.step(1)


def test_reconciliation_defers_a_turn_and_a_turn_run_is_active_until_its_terminal() -> None:
    turn = Turn().start().step(1, CALL).propose()
    plan = recovery_plan(None, turn.state)  # type: ignore[arg-type]  # the plan reads nothing
    assert (plan.defer, plan.abandon, plan.steps) == ("resumable", None, ())

    def shown(state: dict[str, Any]) -> Run:
        return Run("turn:7", "s", "b", "7", "turn", state["status"], None, 1.0,
                   state["finished_at"], None, None, "w", 1, None, 3, state)  # fmt: skip

    turn("request_interrupt", by=None, reason="stop")
    assert shown(turn.state).active  # interrupting is active, though the review has no such state
    turn.terminate("outcome_unknown")
    assert not shown(turn.state).active


@pytest.mark.parametrize(
    "fields",
    [("", "bot", "chat"), ("p", "bot", " chat"), ("p", 5, "chat"), ("p", "bot", "chat", "\x00")],
)
def test_a_session_the_inbox_could_not_admit_is_refused_before_anything_is_written(
    fields: tuple[Any, ...],
) -> None:
    with pytest.raises(ConfigurationError, match="the session's"):
        TurnSession(*fields)
