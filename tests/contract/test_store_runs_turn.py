"""The turn preset on every backend: each transition, the refusals, idempotent replays, the
``answered`` guard, takeovers, the caller's transaction, the tool effect accepted with its
proposal, and reconciliation deferring turns. After every command the run's history verifies in
full, and what the tables hold is read around oncewire (``raw``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.core.errors import (
    BranchBusy,
    HistoryHidden,
    PayloadConflict,
    RunConflict,
    StaleFence,
    TransitionRefused,
)
from oncewire.runs import CommandResult, TurnSession
from oncewire.storage import Store
from oncewire.testing import ManualClock

from .conftest import RawDatabase

SESSION = TurnSession("telegram", "bot-1", "chat-42")
INBOUND = 7
RUN = "turn:7"
LEASE = 30.0
REQ = "1" * 64
RESP = "2" * 64
CALL = {"id": "call-a", "name": "terminal"}
ARGS = {"command": "touch /tmp/x"}


class Turn:
    """One turn driven through ``ledger.runs.turn``, its history verified after each command."""

    def __init__(self, ledger: Ledger, raw: RawDatabase, inbound: int = INBOUND) -> None:
        self.ledger = ledger
        self.raw = raw
        self.inbound = inbound
        self.commands = ledger.runs.turn

    @property
    def run_id(self) -> str:
        return f"turn:{self.inbound}"

    def checked(self, result: CommandResult) -> CommandResult:
        (verification,) = self.ledger.runs.verify(self.run_id)
        assert verification.ok, verification
        return result

    def start(self, session: TurnSession = SESSION, **kw: Any) -> CommandResult:
        kw.setdefault("owner", "worker-1")
        kw.setdefault("lease_seconds", LEASE)
        return self.checked(self.commands.start(self.inbound, session, **kw))

    def step(self, number: int, *calls: dict[str, Any], **kw: Any) -> CommandResult:
        kw.setdefault("request_digest", REQ)
        kw.setdefault("response_digest", RESP)
        kw.setdefault("usage", {"prompt_tokens": 10, "completion_tokens": 5})
        kw.setdefault("finish_reason", "tool_calls" if calls else "stop")
        return self.checked(
            self.commands.record_step(self.inbound, number, tool_calls=list(calls), **kw)
        )

    def propose(self, step: int = 1, index: int = 0, **kw: Any) -> CommandResult:
        kw.setdefault("tool_call_id", CALL["id"])
        kw.setdefault("name", CALL["name"])
        kw.setdefault("arguments", ARGS)
        kw.setdefault("side_effect_class", "external")
        kw.setdefault("dispatch", ("tool.terminal", ARGS))
        return self.checked(self.commands.propose_action(self.inbound, step, index, **kw))

    def resolve(self, step: int = 1, index: int = 0, **kw: Any) -> CommandResult:
        kw.setdefault("status", "succeeded")
        return self.checked(self.commands.resolve_action(self.inbound, step, index, **kw))

    def terminate(self, status: str, **kw: Any) -> CommandResult:
        kw.setdefault("reason", status)
        return self.checked(self.commands.terminate(self.inbound, status, **kw))

    # -- what the tables hold --------------------------------------------------------------
    def row(self) -> dict[str, Any]:
        names = "status, terminal_reason, owner, fence, workflow, scope, branch, turn, head_seq"
        rows = self.raw.query(f"SELECT {names} FROM oncewire_runs WHERE run_id = ?", (self.run_id,))
        assert len(rows) == 1
        return dict(zip(names.split(", "), rows[0], strict=True))

    def event_types(self) -> list[str]:
        rows = self.raw.query(
            "SELECT type FROM oncewire_run_events WHERE run_id = ? ORDER BY seq", (self.run_id,)
        )
        return [r[0] for r in rows]

    def payload(self, event_type: str) -> dict[str, Any]:
        rows = self.raw.query(
            "SELECT payload FROM oncewire_run_events WHERE run_id = ? AND type = ?",
            (self.run_id, event_type),
        )
        assert len(rows) == 1
        value: dict[str, Any] = json.loads(rows[0][0])
        return value

    def actions(self) -> dict[str, tuple[Any, ...]]:
        rows = self.raw.query(
            "SELECT action_id, kind, status, effect_key, side_effect_class "
            "FROM oncewire_run_actions WHERE run_id = ?",
            (self.run_id,),
        )
        return {r[0]: tuple(r[1:]) for r in rows}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(store: Store, clock: ManualClock) -> Iterator[Ledger]:
    yield Ledger(store, clock=clock)  # the store fixture closes the store


@pytest.fixture
def turn(ledger: Ledger, raw: RawDatabase) -> Turn:
    return Turn(ledger, raw)


def _effects(raw: RawDatabase) -> int:
    return raw.count("oncewire_effects")


# -- the happy path ------------------------------------------------------------------------------
def test_a_turn_runs_on_its_session_records_steps_and_tools_and_ends_answered(
    turn: Turn, raw: RawDatabase
) -> None:
    started = turn.start()
    assert started.run.run_id == RUN and started.run.status == "running" and started.run.active
    assert turn.row() == {
        "status": "running",
        "terminal_reason": None,
        "owner": "worker-1",
        "fence": 1,
        "workflow": "turn",
        "scope": "telegram/bot-1/chat-42",
        "branch": "telegram/bot-1/chat-42",
        "turn": "7",
        "head_seq": 1,
    }
    turn.step(1, CALL)
    proposed = turn.propose(max_attempts=2, deadline_seconds=60.0)
    assert proposed.event.type == "action_proposed"
    effect = raw.effect_row("turn/7/s1/0")
    assert effect["kind"] == "tool.terminal" and json.loads(effect["payload"]) == ARGS
    assert effect["state"] == "pending" and effect["max_attempts"] == 2
    assert effect["deadline"] == pytest.approx(effect["created_at"] + 60.0)
    assert turn.actions() == {"s1/0": ("terminal", "proposed", "turn/7/s1/0", "external")}
    turn.resolve(result={"exit_code": 0})
    assert turn.actions()["s1/0"][1] == "succeeded"
    turn.step(2)
    answered = turn.terminate("answered", reason="final_answer", reply_text="Done: x exists.")
    assert answered.run.status == "answered" and not answered.run.active
    assert turn.row()["status"] == "answered"
    assert turn.row()["terminal_reason"] == "final_answer"
    assert turn.event_types() == [
        "run_started",
        "step_recorded",
        "action_proposed",
        "action_resolved",
        "step_recorded",
        "run_terminated",
    ]
    digest = hashlib.sha256(b"Done: x exists.").hexdigest()
    assert turn.payload("run_terminated")["request"]["reply_sha256"] == digest
    recorded = [e.payload["request"] for e in turn.ledger.runs.events(RUN)]
    assert recorded[1]["usage"] == {"prompt_tokens": 10, "completion_tokens": 5}
    assert recorded[1]["tool_calls"] == [CALL]


def test_threads_are_branches_that_run_in_parallel_and_a_session_runs_one_turn_at_a_time(
    ledger: Ledger, raw: RawDatabase
) -> None:
    chat = Turn(ledger, raw, 1)
    thread = Turn(ledger, raw, 2)
    chat.start()
    started = thread.start(TurnSession("telegram", "bot-1", "chat-42", thread="t/9"))
    assert started.run.branch == "telegram/bot-1/chat-42/t%2F9"
    assert started.run.scope == "telegram/bot-1/chat-42"
    with pytest.raises(BranchBusy):
        Turn(ledger, raw, 3).start()
    assert raw.query("SELECT COUNT(*) FROM oncewire_runs WHERE run_id = ?", ("turn:3",)) == [(0,)]
    chat.terminate("cancelled", reason="operator")
    Turn(ledger, raw, 3).start()  # the session is free again


# -- refusals ------------------------------------------------------------------------------------
def test_refused_transitions_write_nothing(turn: Turn, raw: RawDatabase) -> None:
    turn.start()
    turn.step(1, CALL, {"id": "call-b", "name": "web_search"})
    before, effects = turn.event_types(), _effects(raw)
    refusals: list[tuple[str, dict[str, Any]]] = [
        ("a gap in the steps", {"call": lambda: turn.step(3)}),
        ("an index the step did not ask for", {"call": lambda: turn.propose(index=2)}),
        ("another tool than the step's", {"call": lambda: turn.propose(name="rm")}),
        ("another call id", {"call": lambda: turn.propose(tool_call_id="call-z")}),
        ("an earlier step", {"call": lambda: turn.propose(step=0)}),
        ("a bad side-effect class", {"call": lambda: turn.propose(side_effect_class="x")}),
        ("a bad digest", {"call": lambda: turn.step(2, request_digest="nope")}),
        ("answered without a reply", {"call": lambda: turn.terminate("answered")}),
        ("interrupted without an interrupt", {"call": lambda: turn.terminate("interrupted")}),
        ("a status no turn has", {"call": lambda: turn.terminate("verified")}),
        (
            "a steer not after the latest step",
            {"call": lambda: turn.commands.steer(INBOUND, by=8, after_step=0)},
        ),
        (
            "a steer by the turn itself",
            {"call": lambda: turn.commands.steer(INBOUND, by=7, after_step=1)},
        ),
        ("resolving what was never proposed", {"call": lambda: turn.resolve()}),
    ]
    for what, case in refusals:
        with pytest.raises(TransitionRefused):
            case["call"]()
        assert turn.event_types() == before, what
        assert _effects(raw) == effects, what
    with pytest.raises(StaleFence):
        turn.step(2, fence=5)
    assert turn.event_types() == before


def test_no_terminal_but_outcome_unknown_hides_an_unresolved_world_changing_call(
    turn: Turn,
) -> None:
    turn.start()
    turn.step(1, CALL, {"id": "call-b", "name": "read_file"})
    turn.propose()
    turn.propose(index=1, tool_call_id="call-b", name="read_file", side_effect_class="read_only")
    for status in ("answered", "failed", "cancelled"):
        with pytest.raises(TransitionRefused, match="outcome is unknown"):
            turn.terminate(status, reply_text="text")
    turn.resolve(status="failed")  # the write is known now; the read-only call holds nothing
    turn.terminate("answered", reply_text="I could not create it.")
    assert turn.row()["status"] == "answered"


def test_outcome_unknown_is_the_honest_end_of_a_call_nobody_can_settle(turn: Turn) -> None:
    turn.start()
    turn.step(1, CALL)
    turn.propose()
    ended = turn.terminate("outcome_unknown", reason="tool_outcome_unknown", reply_text="Maybe.")
    assert ended.run.status == "outcome_unknown"
    assert turn.actions()["s1/0"][1] == "proposed"  # still unresolved: nothing was invented


# -- idempotency ---------------------------------------------------------------------------------
def test_the_same_command_again_replays_and_a_changed_one_is_refused(
    turn: Turn, raw: RawDatabase
) -> None:
    assert not turn.start().replayed
    again = turn.start()
    assert again.replayed and again.event.seq == 1
    turn.step(1, CALL)
    first = turn.propose()
    effects = _effects(raw)
    replays = [
        lambda: turn.step(1, CALL),
        lambda: turn.propose(),
    ]
    for replay in replays:
        result = replay()
        assert result.replayed
    assert turn.propose().event == first.event
    count = len(turn.event_types())
    conflicts = [
        lambda: turn.step(1, CALL, response_digest="3" * 64),
        lambda: turn.propose(arguments={"command": "rm -rf /"}),
        lambda: turn.start(TurnSession("telegram", "bot-1", "chat-43")),
    ]
    for conflict in conflicts:
        with pytest.raises(RunConflict):
            conflict()
    assert len(turn.event_types()) == count and _effects(raw) == effects
    turn.resolve()
    assert turn.resolve().replayed
    with pytest.raises(RunConflict):
        turn.resolve(status="failed")
    turn.terminate("answered", reply_text="hello")
    replayed = turn.terminate("answered", reply_text="hello")
    assert replayed.replayed and replayed.run.status == "answered"
    with pytest.raises(RunConflict):
        turn.terminate("answered", reply_text="another text")
    assert turn.event_types()[-1] == "run_terminated"
    assert len(turn.event_types()) == count + 2


def test_a_changed_dispatch_under_a_replayed_proposal_is_refused_by_the_outbox(
    turn: Turn, raw: RawDatabase
) -> None:
    turn.start()
    turn.step(1, CALL)
    with turn.ledger.transaction() as tx:  # someone else's effect holds the key already
        tx.accept("turn/7/s1/0", "tool.terminal", {"command": "other"})
    with pytest.raises(PayloadConflict):
        turn.propose()
    assert turn.actions() == {}
    assert turn.event_types() == ["run_started", "step_recorded"]
    assert json.loads(raw.effect_row("turn/7/s1/0")["payload"]) == {"command": "other"}


# -- interrupts, steering --------------------------------------------------------------------------
def test_an_interrupt_stops_new_work_lets_calls_settle_and_wins_over_the_answer(
    turn: Turn, raw: RawDatabase
) -> None:
    turn.start()
    turn.step(1, CALL, {"id": "call-b", "name": "web_search"})
    turn.propose()
    interrupted = turn.checked(turn.commands.request_interrupt(INBOUND, by=8, reason="new_message"))
    assert interrupted.run.status == "interrupting" and interrupted.run.active
    assert turn.row()["status"] == "interrupting"
    before, effects = turn.event_types(), _effects(raw)
    for refused in (
        lambda: turn.step(2),
        lambda: turn.propose(index=1, tool_call_id="call-b", name="web_search"),
        lambda: turn.commands.steer(INBOUND, by=9, after_step=1),
        lambda: turn.commands.request_interrupt(INBOUND, by=9, reason="new_message"),
    ):
        with pytest.raises(TransitionRefused):
            refused()
    assert turn.event_types() == before and _effects(raw) == effects
    assert turn.commands.request_interrupt(INBOUND, by=8, reason="new_message").replayed
    turn.resolve()  # the call in flight settles
    with pytest.raises(TransitionRefused, match="interrupted before its answer"):
        turn.terminate("answered", reply_text="too late")
    turn.terminate("interrupted", reason="superseded")
    assert turn.row()["status"] == "interrupted"
    assert turn.payload("interrupt_requested")["request"] == {"by": 8, "reason": "new_message"}


def test_an_interrupt_after_the_answer_is_refused_by_the_table(turn: Turn) -> None:
    turn.start()
    turn.step(1)
    turn.terminate("answered", reply_text="hi")
    with pytest.raises(TransitionRefused, match="not allowed from answered"):
        turn.commands.request_interrupt(INBOUND, by=8, reason="new_message")


def test_a_steer_links_the_inbound_it_merged(turn: Turn) -> None:
    turn.start()
    turn.step(1, CALL)
    steered = turn.checked(turn.commands.steer(INBOUND, by=8, after_step=1))
    assert steered.event.type == "run_steered" and steered.run.state["steered"] == [8]
    assert turn.commands.steer(INBOUND, by=8, after_step=1).replayed
    with pytest.raises(RunConflict):
        turn.commands.steer(INBOUND, by=8, after_step=2)
    turn.step(2)
    turn.checked(turn.commands.steer(INBOUND, by=9, after_step=2))
    assert turn.ledger.runs.get(RUN).state["steered"] == [8, 9]


# -- takeovers and release -----------------------------------------------------------------------
def test_a_takeover_moves_the_fence_and_refuses_the_previous_owner(
    turn: Turn, clock: ManualClock
) -> None:
    turn.start()
    turn.step(1, CALL)
    turn.propose()
    resume = turn.commands.resume
    with pytest.raises(TransitionRefused, match="lease live"):
        resume(INBOUND, owner="worker-2", from_fence=1, lease_seconds=LEASE)
    assert turn.row()["fence"] == 1
    clock.advance(LEASE + 1)
    resumed = turn.checked(resume(INBOUND, owner="worker-2", from_fence=1, lease_seconds=LEASE))
    assert resumed.event.type == "run_resumed" and resumed.run.fence == 2
    assert (turn.row()["owner"], turn.row()["fence"]) == ("worker-2", 2)
    again = resume(INBOUND, owner="worker-2", from_fence=1, lease_seconds=LEASE)
    assert again.replayed and again.event == resumed.event
    with pytest.raises(RunConflict):  # someone else took it over from fence 1 first
        resume(INBOUND, owner="worker-3", from_fence=1, lease_seconds=LEASE)
    with pytest.raises(StaleFence):
        turn.resolve(fence=1)  # the old worker's late write
    turn.resolve(fence=2)  # the recorded step and call are reused: the turn goes on
    turn.step(2, fence=2)
    turn.terminate("answered", reply_text="ok", fence=2)
    assert turn.event_types().count("run_resumed") == 1


def test_a_live_owner_named_dead_is_taken_over_and_an_interrupting_turn_resumes(
    turn: Turn,
) -> None:
    turn.start()
    turn.commands.request_interrupt(INBOUND, by=None, reason="stop")
    resumed = turn.checked(
        turn.commands.resume(
            INBOUND, owner="worker-2", from_fence=1, lease_seconds=LEASE, dead_owners=["worker-1"]
        )
    )
    assert resumed.run.status == "interrupting"
    turn.terminate("interrupted", reason="stopped", fence=2)


def test_abandon_releases_the_turn_and_frees_its_session(turn: Turn, raw: RawDatabase) -> None:
    turn.start()
    turn.step(1)
    released = turn.commands.abandon(INBOUND, reason="nothing_truthful")
    assert released.run.status == "running" and not released.run.active
    assert released.run.abandoned_at is not None
    rows = raw.query(
        "SELECT abandoned_at, abandon_reason FROM oncewire_runs WHERE run_id = ?", (RUN,)
    )
    assert rows[0][0] is not None and rows[0][1] == "nothing_truthful"
    (verification,) = turn.ledger.runs.verify(RUN)
    assert verification.ok
    assert turn.commands.abandon(INBOUND, reason="nothing_truthful").replayed
    with pytest.raises(HistoryHidden):
        turn.step(2)
    Turn(turn.ledger, raw, 8).start()


# -- the caller's transaction ---------------------------------------------------------------------
def test_start_in_a_caller_transaction_that_rolls_back_leaves_nothing(
    ledger: Ledger, raw: RawDatabase
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), ledger.store.transaction() as tx:
        ledger.runs.turn.start_in_tx(tx, INBOUND, SESSION, owner="worker-1")
        ledger.effects.accept_in_tx(tx, "caller-row", "note", {"n": 1})
        raise Boom
    for table in ("oncewire_runs", "oncewire_run_events", "oncewire_run_branches"):
        assert raw.count(table) == 0, table
    assert raw.count("oncewire_effects") == 0
    with ledger.store.transaction() as tx:
        started = ledger.runs.turn.start_in_tx(tx, INBOUND, SESSION, owner="worker-1")
        ledger.effects.accept_in_tx(tx, "caller-row", "note", {"n": 1})
    assert not started.replayed
    assert raw.count("oncewire_runs") == 1 and raw.count("oncewire_effects") == 1
    (verification,) = ledger.runs.verify(RUN)
    assert verification.ok


def test_a_proposal_and_its_effect_commit_together_or_not_at_all(
    turn: Turn, raw: RawDatabase
) -> None:
    turn.start()
    turn.step(1, CALL)

    class Boom(Exception):
        pass

    with pytest.raises(Boom), turn.ledger.store.transaction() as tx:
        turn.commands.propose_action_in_tx(
            tx,
            INBOUND,
            1,
            0,
            tool_call_id="call-a",
            name="terminal",
            arguments=ARGS,
            side_effect_class="external",
            dispatch=("tool.terminal", ARGS),
        )
        raise Boom
    assert _effects(raw) == 0 and turn.actions() == {}
    assert turn.event_types() == ["run_started", "step_recorded"]
    turn.propose()
    assert _effects(raw) == 1 and set(turn.actions()) == {"s1/0"}


def test_a_step_and_its_proposals_commit_in_one_caller_transaction(
    turn: Turn, raw: RawDatabase
) -> None:
    turn.start()
    calls = [CALL, {"id": "call-b", "name": "terminal"}]
    with turn.ledger.store.transaction() as tx:
        turn.commands.record_step_in_tx(
            tx,
            INBOUND,
            1,
            request_digest=REQ,
            response_digest=RESP,
            usage={},
            finish_reason="tool_calls",
            tool_calls=calls,
        )
        for index, call in enumerate(calls):
            turn.commands.propose_action_in_tx(
                tx,
                INBOUND,
                1,
                index,
                tool_call_id=call["id"],
                name=call["name"],
                arguments={"i": index},
                side_effect_class="external",
                dispatch=("tool.terminal", {"i": index}),
            )
    assert [r[0] for r in raw.query("SELECT key FROM oncewire_effects ORDER BY key")] == [
        "turn/7/s1/0",
        "turn/7/s1/1",
    ]
    assert turn.event_types() == [
        "run_started",
        "step_recorded",
        "action_proposed",
        "action_proposed",
    ]
    (verification,) = turn.ledger.runs.verify(RUN)
    assert verification.ok


# -- reconciliation -------------------------------------------------------------------------------
def test_reconcile_defers_a_turn_and_keeps_the_review_plan(
    ledger: Ledger, raw: RawDatabase, clock: ManualClock
) -> None:
    turn = Turn(ledger, raw)
    turn.start()
    turn.step(1, CALL)
    turn.propose()
    ledger.runs.start(
        "review-1", key="start", scope="reviews", owner="worker-1", lease_seconds=LEASE
    )
    clock.advance(LEASE + 1)
    row_before = turn.row()
    lease_before = raw.query("SELECT lease_expires_at FROM oncewire_runs WHERE run_id = ?", (RUN,))
    reports = {r.subject_id: r for r in ledger.runs.reconcile(owner="operator")}
    assert (reports[RUN].outcome, reports[RUN].status, reports[RUN].reason) == (
        "deferred",
        "running",
        "resumable",
    )
    assert (reports["review-1"].outcome, reports["review-1"].status) == (
        "terminal",
        "review_unavailable",
    )
    assert turn.row() == row_before
    assert raw.query("SELECT lease_expires_at FROM oncewire_runs WHERE run_id = ?", (RUN,)) == (
        lease_before
    )
    stored = raw.query(
        "SELECT outcome, reason FROM oncewire_run_reports WHERE subject_id = ?", (RUN,)
    )
    assert stored == [("deferred", "resumable")]
    again = ledger.runs.reconcile(owner="operator")
    assert [(r.subject_id, r.outcome) for r in again] == [(RUN, "deferred")]
    # The gateway, not reconciliation, carries the turn on.
    turn.checked(
        ledger.runs.turn.resume(INBOUND, owner="gateway-2", from_fence=1, lease_seconds=LEASE)
    )
    assert ledger.runs.reconcile(owner="operator") == []
