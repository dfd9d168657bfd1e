"""The turn preset with the ledgers it commits beside, on a real SQLite file and a real
PostgreSQL schema: the answer and the ``answered`` terminal in one transaction (an interrupt
recorded first rolls the answer back), a worker killed with SIGKILL mid-turn and its turn taken
over by the next process, and ``oncewire runs reconcile`` deferring turns from the command line.
What the tables hold is read around oncewire."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
from collections.abc import Callable, Iterator

import pytest

from oncewire import Ledger
from oncewire.cli import main
from oncewire.core.errors import BranchBusy, TransitionRefused
from oncewire.replies import TELEGRAM_LIKE
from oncewire.runs import TurnSession
from oncewire.testing import ManualClock
from tests.support.runs_db import RunsDatabase

SESSION = TurnSession("telegram", "bot-1", "chat-42")
LEASE = 30.0
DIGEST = "5" * 64

Child = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def db(store_url: str) -> Iterator[RunsDatabase]:
    opened = RunsDatabase(store_url)
    yield opened


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(db: RunsDatabase, clock: ManualClock) -> Iterator[Ledger]:
    with Ledger(db.url, clock=clock) as opened:
        yield opened


def admit(ledger: Ledger, message_id: str) -> int:
    return ledger.inbound.admit(
        "telegram", "bot-1", "chat-42", message_id, {"text": "hi"}
    ).inbound.id


def step(ledger: Ledger, inbound: int, number: int, *calls: dict[str, str]) -> None:
    ledger.runs.turn.record_step(
        inbound,
        number,
        request_digest=DIGEST,
        response_digest=DIGEST,
        usage={"total_tokens": 12},
        finish_reason="tool_calls" if calls else "stop",
        tool_calls=list(calls),
    )


def test_the_answer_and_the_answered_terminal_commit_together(
    ledger: Ledger, db: RunsDatabase
) -> None:
    inbound = admit(ledger, "m-1")
    ledger.runs.turn.start(inbound, SESSION, owner="worker", lease_seconds=LEASE)
    step(ledger, inbound, 1)
    with ledger.store.transaction() as tx:
        reply = ledger.replies.commit_in_tx(tx, inbound, "Hello there.", TELEGRAM_LIKE)
        ledger.runs.turn.terminate_in_tx(
            tx, inbound, "answered", reason="final_answer", reply_text=reply.final_text
        )
    (stored,) = db.query("SELECT final_text FROM oncewire_replies WHERE inbound_id = ?", (inbound,))
    (terminal,) = db.query(
        "SELECT payload FROM oncewire_run_events WHERE run_id = ? AND terminal = ?",
        (f"turn:{inbound}", True if db.dialect == "postgresql" else 1),
    )
    recorded = json.loads(terminal["payload"])["request"]["reply_sha256"]
    assert recorded == hashlib.sha256(stored["final_text"].encode("utf-8")).hexdigest()
    (run,) = db.query(
        "SELECT status, finished_at FROM oncewire_runs WHERE run_id = ?", (f"turn:{inbound}",)
    )
    assert run["status"] == "answered" and run["finished_at"] is not None
    assert all(v.ok for v in ledger.runs.verify())


def test_an_interrupt_recorded_before_the_answer_rolls_the_answer_back(
    ledger: Ledger, db: RunsDatabase
) -> None:
    inbound = admit(ledger, "m-1")
    successor = admit(ledger, "m-2")
    ledger.runs.turn.start(inbound, SESSION, owner="worker", lease_seconds=LEASE)
    step(ledger, inbound, 1)
    # The next message's admission records the interrupt while the worker finishes its answer.
    ledger.runs.turn.request_interrupt(inbound, by=successor, reason="new_message")
    with pytest.raises(TransitionRefused), ledger.store.transaction() as tx:
        ledger.replies.commit_in_tx(tx, inbound, "A stale answer.", TELEGRAM_LIKE)
        ledger.runs.turn.terminate_in_tx(
            tx, inbound, "answered", reason="final_answer", reply_text="A stale answer."
        )
    assert db.query("SELECT final_text FROM oncewire_replies WHERE inbound_id = ?", (inbound,)) in (
        [],
        [(None,)],
    )
    ledger.runs.turn.terminate(inbound, "interrupted", reason="superseded")
    (run,) = db.query("SELECT status FROM oncewire_runs WHERE run_id = ?", (f"turn:{inbound}",))
    assert run["status"] == "interrupted"


WORKER = """
import sys
from oncewire import Ledger
from oncewire.runs import TurnSession

with Ledger(sys.argv[1]) as ledger:
    inbound = ledger.inbound.admit("telegram", "bot-1", "chat-42", "m-1", {"text": "x"}).inbound.id
    turn = ledger.runs.turn
    turn.start(inbound, TurnSession("telegram", "bot-1", "chat-42"), lease_seconds=3600)
    turn.record_step(inbound, 1, request_digest="5" * 64, response_digest="5" * 64, usage={},
                     finish_reason="tool_calls", tool_calls=[{"id": "c1", "name": "terminal"}])
    print("step recorded", flush=True)
    turn.propose_action(inbound, 1, 0, tool_call_id="c1", name="terminal",
                        arguments={"cmd": "touch x"}, side_effect_class="external",
                        dispatch=("tool.terminal", {"cmd": "touch x"}))
    print("survived", flush=True)
"""


@pytest.mark.crash
def test_a_turn_killed_mid_flight_is_deferred_by_reconcile_and_resumed_by_the_next_process(
    db: RunsDatabase, python_child: Child, child_env: Callable[..., dict[str, str]]
) -> None:
    # Die right after the proposal (and its effect) committed: the third command's commit.
    child = python_child(
        WORKER, db.url, env=child_env(ONCEWIRE_CRASH="runs.command_after_commit@3")
    )
    out, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, err
    assert out.splitlines() == ["step recorded"]
    with Ledger(db.url, reconcile_runs_as="boot") as booted:
        reports = booted.runs.last_reconciliation
        assert [(r.subject_id, r.outcome, r.reason) for r in reports] == [
            ("turn:1", "deferred", "resumable")
        ]
        (row,) = db.query("SELECT status, fence, head_seq FROM oncewire_runs", ())
        assert tuple(row) == ("running", 1, 3)
        # The lease is far from over, but its owner is a process on this host that is gone.
        resumed = booted.runs.turn.resume(1, owner="gateway-2", from_fence=1, lease_seconds=LEASE)
        assert resumed.run.fence == 2 and resumed.run.state["steps"] == 1
        effect = booted.effects.get("turn/1/s1/0")
        assert effect.kind == "tool.terminal" and str(effect.state) == "pending"
        booted.runs.turn.resolve_action(1, 1, 0, status="not_run", fence=2)
        booted.runs.turn.terminate(1, "failed", reason="restarted", reply_text="Sorry.", fence=2)
        assert all(v.ok for v in booted.runs.verify())
    types = [r["type"] for r in db.query("SELECT type FROM oncewire_run_events ORDER BY seq", ())]
    assert types == [
        "run_started",
        "step_recorded",
        "action_proposed",
        "run_resumed",
        "action_resolved",
        "run_terminated",
    ]
    assert db.query("SELECT COUNT(*) AS n FROM oncewire_effects", ())[0]["n"] == 1


def test_the_command_line_reconcile_defers_turns(
    db: RunsDatabase, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger(db.url, clock=ManualClock()) as ledger:
        ledger.runs.turn.start(admit(ledger, "m-1"), SESSION, owner="w", lease_seconds=5)
        ledger.runs.start("review-1", key="start", scope="reviews", owner="w", lease_seconds=5)
    monkeypatch.setattr("time.time", lambda: 1_800_000_100.0)  # both leases ran out
    code = main(["runs", "reconcile", "--db", db.url, "--owner", "cli", "--yes", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    assert sorted((r["subject_id"], r["outcome"], r["reason"]) for r in json.loads(out)) == [
        ("review-1", "terminal", "lease_expired"),
        ("turn:1", "deferred", "resumable"),
    ]
    (row,) = db.query(
        "SELECT status, fence, owner FROM oncewire_runs WHERE run_id = ?", ("turn:1",)
    )
    assert tuple(row) == ("running", 1, "w")


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _rehash(run_id: str, seq: int, type_: str, prev_hash: str, payload_json: str) -> str:
    """The event hash recomputed without a key, as a tamperer with the code would."""
    material = f"{run_id}\x1f{seq}\x1f{type_}\x1f{prev_hash}\x1f{payload_json}".encode()
    return hashlib.sha256(material).hexdigest()


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ({"reply_sha256": None}, "answered needs the committed reply's text digest"),
        ({"status": "interrupted"}, "interrupted needs a recorded interrupt"),
    ],
)
def test_a_rehashed_terminal_no_command_could_write_fails_verification(
    ledger: Ledger, db: RunsDatabase, edit: dict[str, object], reason: str
) -> None:
    inbound = admit(ledger, "m-1")
    ledger.runs.turn.start(inbound, SESSION, owner="worker", lease_seconds=LEASE)
    step(ledger, inbound, 1)
    ledger.runs.turn.terminate(inbound, "answered", reason="final_answer", reply_text="Hi.")
    (row,) = db.query(
        "SELECT id, run_id, seq, type, prev_hash, payload FROM oncewire_run_events "
        "WHERE type = 'run_terminated'",
    )
    payload = json.loads(row["payload"])
    payload["request"].update(edit)
    # A consistent forgery: the request digest, the payload and the hash all recomputed.
    payload["digest"] = hashlib.sha256(
        _canonical({"command": "terminate", "request": payload["request"]}).encode()
    ).hexdigest()
    text = _canonical(payload)
    forged = _rehash(row["run_id"], row["seq"], row["type"], row["prev_hash"], text)
    db.tamper(
        (
            "UPDATE oncewire_run_events SET payload = ?, hash = ?, request_digest = ? WHERE id = ?",
            (text, forged, payload["digest"], row["id"]),
        ),
        ("UPDATE oncewire_runs SET head_hash = ? WHERE run_id = ?", (forged, row["run_id"])),
    )
    (verification,) = ledger.runs.verify(row["run_id"])
    assert not verification.ok and verification.first_bad_seq == row["seq"]
    assert verification.reason is not None and reason in verification.reason
    shown = ledger.runs.get(row["run_id"])
    assert (shown.status, shown.terminal_reason) == ("failed", "safety_boundary")


def test_a_turn_starts_in_one_transaction_with_the_inbox_and_the_reply_record(
    ledger: Ledger, db: RunsDatabase
) -> None:
    inbound = admit(ledger, "m-1")
    busy = admit(ledger, "m-2")
    ledger.runs.turn.start(busy, SESSION, owner="worker", lease_seconds=LEASE)  # holds the session

    def start_turn(inbound_id: int) -> None:
        with ledger.store.transaction() as tx:
            assert ledger.inbound.start_in_tx(tx, inbound_id) is not None
            ledger.replies.open_in_tx(tx, inbound_id, TELEGRAM_LIKE)
            ledger.runs.turn.start_in_tx(tx, inbound_id, SESSION, owner="worker")

    with pytest.raises(BranchBusy):
        start_turn(inbound)  # the run start is refused: the inbox's start and the reply go too
    (row,) = db.query("SELECT status, attempts FROM oncewire_inbound WHERE id = ?", (inbound,))
    assert tuple(row) == ("received", 0)
    assert db.query("SELECT id FROM oncewire_replies WHERE inbound_id = ?", (inbound,)) == []
    ledger.runs.turn.terminate(busy, "cancelled", reason="operator")
    start_turn(inbound)
    (row,) = db.query("SELECT status, attempts FROM oncewire_inbound WHERE id = ?", (inbound,))
    assert tuple(row) == ("answering", 1)
    assert len(db.query("SELECT id FROM oncewire_replies WHERE inbound_id = ?", (inbound,))) == 1
    assert ledger.runs.get(f"turn:{inbound}").status == "running"


def test_a_turn_left_by_a_dead_process_refuses_the_session_and_says_a_takeover_resumes_it(
    ledger: Ledger, clock: ManualClock
) -> None:
    left = admit(ledger, "m-1")
    ledger.runs.turn.start(left, SESSION, owner="dead", lease_seconds=LEASE)
    clock.advance(LEASE + 1)
    with pytest.raises(BranchBusy) as refused:
        ledger.runs.turn.start(admit(ledger, "m-2"), SESSION, owner="worker")
    assert refused.value.fields["requires_reconciliation"] is True
    # Boot reconciliation defers turns: the hint names what does finish one.
    assert "a takeover resumes it" in str(refused.value)
    assert "reconciliation" not in str(refused.value)
