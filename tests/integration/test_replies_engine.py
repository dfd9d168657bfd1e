"""The reply engine beyond the fault matrix: re-delivered inbound messages, schedules that do
not block other chats, bounded attempts with one honest notice, threads, the caller's
transaction, leases, quarantine, cadence and the number of durable commits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.errors import ReplyConflict
from oncewire.inbound import InboundState
from oncewire.lab.suites.replies_rig import PROFILES, Rig, footer, header, reply_text
from oncewire.replies import NotDelivered, ReplyEngine, ReplyState, rejoin
from oncewire.testing import ManualClock
from oncewire.testing.fake_platform import Fault


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with Rig(tmp_path / "rig", clock=ManualClock()) as opened:
        yield opened


def _only_reply(rig: Rig, platform: str, chat: str, aid: str, inbound_id: int) -> None:
    failures = rig.check(platform, chat, aid, inbound_id, "exact")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("when", ["during", "after", "after_restart"])
def test_redelivered_inbound_is_processed_once(tmp_path: Path, when: str) -> None:
    folder = tmp_path / "rig"
    aid, chat = f"A-{when}", f"r-{when}"
    text = reply_text(aid, "answer once " * 6)
    with Rig(folder, clock=ManualClock()) as rig:
        first = rig.admit("fk_tg", chat, "in-1")
        assert first.new
        seen: list[bool] = []

        def stream() -> Iterator[str]:
            for n in range(0, len(text), 10):
                if when == "during" and n == 20:
                    seen.append(rig.admit("fk_tg", chat, "in-1").new)
                yield text[n : n + 10]

        rig.engine.stream(
            first.inbound.id,
            stream(),
            on_commit=lambda tx, t: rig._persist(tx, first.inbound.id, t),
        )
        if when == "after":
            seen.append(rig.admit("fk_tg", chat, "in-1").new)
    if when == "after_restart":
        with Rig(folder, clock=ManualClock()) as again:
            report = again.engine.recover()
            seen.append(again.admit("fk_tg", chat, "in-1").new)
            assert report.unanswered == [] and report.delivered == []
    assert seen == [False]
    with Rig(folder, clock=ManualClock()) as rig:
        inbound = rig.ledger.inbound.get(first.inbound.id)
        assert inbound.deliveries == 2 and inbound.status is InboundState.DELIVERED
        assert len(rig.ledger.inbound.list()) == 1
        _only_reply(rig, "fk_tg", chat, aid, inbound.id)


def test_a_long_rate_limit_is_scheduled_and_does_not_block_other_chats(tmp_path: Path) -> None:
    faults = [Fault("rate_limit", chat="slow", retry_after=300.0)]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        slow = rig.admit("fk_dc", "slow", "in-1")
        fast = rig.admit("fk_dc", "fast", "in-2")
        held = rig.answer(slow.inbound.id, reply_text("A-slow", "throttled."))
        assert held.status == "scheduled"
        assert held.reply.not_before == pytest.approx(rig.ledger.clock.now() + 300.0)
        done = rig.answer(fast.inbound.id, reply_text("A-fast", "not throttled."))
        assert done.status == "delivered"
        assert rig.engine.run_due() == []  # not due yet: nothing is sent early
        rig.settle()
        _only_reply(rig, "fk_dc", "slow", "A-slow", slow.inbound.id)
        _only_reply(rig, "fk_dc", "fast", "A-fast", fast.inbound.id)


def test_a_rate_limit_longer_than_a_day_is_scheduled_a_day_later(tmp_path: Path) -> None:
    """A platform's retry_after of years was stored and waited for as it was: the reply slept
    past any lease and any operator's patience. It is a day at most, as an effect's NotSent."""
    assert NotDelivered("429", retry_after=10**9).retry_after == MAX_RETRY_SECONDS
    assert NotDelivered("429", retry_after=30).retry_after == 30
    faults = [Fault("rate_limit", chat="slow", retry_after=10.0**9, times=1)]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        slow = rig.admit("fk_dc", "slow", "in-1")
        held = rig.answer(slow.inbound.id, reply_text("A-slow", "throttled for ages."))
        assert held.status == "scheduled"
        now = rig.ledger.clock.now()
        assert held.reply.not_before == pytest.approx(now + MAX_RETRY_SECONDS)
        (op,) = rig.ledger.replies.ops(held.reply.id)
        assert op.retry_after == MAX_RETRY_SECONDS  # what the record keeps, too
        rig.settle()  # a day later, it goes out
        _only_reply(rig, "fk_dc", "slow", "A-slow", slow.inbound.id)


def test_out_of_attempts_is_dead_with_one_honest_notice(tmp_path: Path) -> None:
    aid = "A-dead"
    faults = [Fault("timeout", contains=footer(aid), times=100)]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        admission = rig.admit("fk_ne", "gone", "in-1")
        rig.answer(admission.inbound.id, reply_text(aid, "never lands."))
        rig.settle()
        reply = rig.ledger.replies.for_inbound(admission.inbound.id)
        assert reply is not None and reply.state is ReplyState.DEAD
        assert reply.attempts == reply.max_attempts
        assert "out of attempts" in (reply.last_error or "")
        shown = [m.text for m in rig.view().visible("fk_ne", "gone")]
        assert shown == [rig.engine.notice]
        # Dead is terminal: nothing more is tried, and the inbound says it was answered.
        assert rig.engine.deliver(reply.id).status == "dead"
        assert rig.ledger.inbound.get(admission.inbound.id).status is InboundState.ANSWERED
        assert len([op for op in rig.ledger.replies.ops(reply.id) if op.slot == -1]) == 1


def test_a_permanent_rejection_is_dead_at_once(tmp_path: Path) -> None:
    aid = "A-blocked"
    faults = [Fault("rejected", contains=footer(aid))]
    with Rig(tmp_path / "rig", clock=ManualClock(), faults=faults) as rig:
        admission = rig.admit("fk_tg", "blocked", "in-1")
        result = rig.answer(admission.inbound.id, reply_text(aid, "refused for good."))
        assert result.status == "dead" and result.reply.attempts == 1
        assert "rejected" in (result.reply.last_error or "")


def test_threads_and_reply_targets_are_kept(rig: Rig) -> None:
    admission = rig.admit("fk_dc", "guild", "in-7", thread="thr-2")
    rig.answer(admission.inbound.id, reply_text("A-thread", "in the thread."), "many")
    shown = rig.view().visible("fk_dc", "guild")
    assert [(m.thread, m.reply_to) for m in shown] == [("thr-2", "in-7")]
    reply = rig.ledger.replies.for_inbound(admission.inbound.id)
    assert reply is not None and reply.request.thread == "thr-2"
    assert reply.request.reply_to == "in-7"


def test_the_reply_commits_with_the_callers_rows_or_not_at_all(rig: Rig) -> None:
    admission = rig.admit("fk_tg", "tx", "in-1")
    profile = rig.platforms["fk_tg"].profile
    with pytest.raises(RuntimeError), rig.ledger.transaction() as tx:
        rig._persist(tx, admission.inbound.id, "draft")
        rig.ledger.replies.commit_in_tx(tx, admission.inbound.id, "draft", profile)
        raise RuntimeError("the caller failed after writing")
    assert rig.ledger.replies.for_inbound(admission.inbound.id) is None
    assert rig.transcript(admission.inbound.id) == []
    reply = rig.ledger.replies.commit(admission.inbound.id, "final", profile)
    assert rig.ledger.replies.commit(admission.inbound.id, "final", profile).id == reply.id
    with pytest.raises(ReplyConflict):
        rig.ledger.replies.commit(admission.inbound.id, "another text", profile)


def test_a_reply_leased_to_a_live_engine_is_left_alone(rig: Rig) -> None:
    admission = rig.admit("fk_tg", "lease", "in-1")
    profile = rig.platforms["fk_tg"].profile
    reply = rig.ledger.replies.commit(admission.inbound.id, "hello", profile)
    now = rig.ledger.clock.now()
    assert rig.ledger.store.claim_reply(reply.id, owner="someone-alive", now=now, lease_seconds=60)
    assert rig.engine.deliver(reply.id).status == "busy"
    assert rig.view().visible("fk_tg", "lease") == []
    rig.ledger.clock.sleep(61)  # the lease runs out: the engine may take over
    assert rig.engine.deliver(reply.id).status == "delivered"


def test_a_message_that_keeps_killing_its_process_is_quarantined_alone(rig: Rig) -> None:
    poison = rig.admit("fk_tg", "q", "in-1").inbound.id
    healthy = rig.admit("fk_tg", "q", "in-2").inbound.id
    for _ in range(3):
        assert rig.ledger.inbound.start(poison) is not None
    assert rig.ledger.inbound.start(poison) is None
    assert rig.ledger.inbound.get(poison).status is InboundState.QUARANTINED
    assert [i.id for i in rig.ledger.inbound.unanswered()] == [healthy]


def test_previews_keep_a_bounded_cadence(tmp_path: Path) -> None:
    with Rig(tmp_path / "rig", clock=ManualClock(), edit_interval_seconds=1.0) as rig:
        admission = rig.admit("fk_tg", "cadence", "in-1")
        text = reply_text("A-cadence", "streamed " * 40)

        def deltas() -> Iterator[str]:
            for n in range(0, len(text), 12):
                rig.ledger.clock.sleep(0.25)  # four deltas per permitted edit
                yield text[n : n + 12]

        rig.engine.stream(
            admission.inbound.id,
            deltas(),
            on_commit=lambda tx, t: rig._persist(tx, admission.inbound.id, t),
        )
        pieces = -(-len(text) // 12)
        calls = rig.platforms["fk_tg"].calls
        assert len(calls) <= pieces // 4 + 3
        _only_reply(rig, "fk_tg", "cadence", "A-cadence", admission.inbound.id)


def test_a_short_unstreamed_reply_costs_three_commits(rig: Rig) -> None:
    admission = rig.admit("fk_tg", "count", "in-1")
    commits: list[str] = []

    def trace(sql: str) -> None:
        if sql.strip().upper() == "COMMIT":
            commits.append(sql)

    conn = rig.ledger.store.db.conn()
    conn.set_trace_callback(trace)
    try:
        result = rig.answer(admission.inbound.id, reply_text("A-count", "short."))
    finally:
        conn.set_trace_callback(None)
    assert result.status == "delivered"
    assert len(commits) == 3  # the answer with its record, the send in flight, the ack


def test_answering_again_delivers_the_committed_answer_once(rig: Rig) -> None:
    admission = rig.admit("fk_tg", "again", "in-1")
    text = reply_text("A-again", "committed before a crash.")
    with rig.ledger.transaction() as tx:  # the answer is committed; then the process died
        rig._persist(tx, admission.inbound.id, text)
        rig.ledger.replies.commit_in_tx(
            tx, admission.inbound.id, text, rig.platforms["fk_tg"].profile
        )
    assert rig.answer(admission.inbound.id, text).status == "delivered"  # no second transcript row
    _only_reply(rig, "fk_tg", "again", "A-again", admission.inbound.id)
    with pytest.raises(ReplyConflict):
        rig.answer(admission.inbound.id, "a different answer")


def test_parallel_threads_are_independent(rig: Rig) -> None:
    """Two Discord threads of one channel stream at the same time, one engine each."""
    tokens = ("A-th1", "A-th2")
    admissions = [rig.admit("fk_dc", "par", f"in-{n}", thread=f"thr{n}") for n in range(2)]
    errors: list[BaseException] = []

    def answer(n: int) -> None:
        engine = ReplyEngine(rig.ledger, rig.platforms, edit_interval_seconds=0.0)
        text = reply_text(tokens[n], f"reply for thread {n} " * 150)
        inbound_id = admissions[n].inbound.id
        try:
            pieces = [text[i : i + 200] for i in range(0, len(text), 200)]
            engine.stream(
                inbound_id, pieces, on_commit=lambda tx, t: rig._persist(tx, inbound_id, t)
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=answer, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    for n, token in enumerate(tokens):
        _only_reply_anywhere(rig, token, admissions[n].inbound.id, f"thr{n}")


def _only_reply_anywhere(rig: Rig, aid: str, inbound_id: int, thread: str) -> None:
    view = rig.view()
    mine = [m for m in view.visible("fk_dc", "par") if m.thread == thread]
    assert mine and PROFILES["fk_dc"].strip_marker(mine[0].text)[0].startswith(header(aid))
    assert all(not PROFILES["fk_dc"].strip_marker(m.text)[1] for m in mine)
    reply = rig.ledger.replies.for_inbound(inbound_id)
    assert reply is not None and reply.state is ReplyState.DELIVERED
    assert rejoin([m.text for m in mine]) == reply.final_text == rig.transcript(inbound_id)[0]


def test_an_engine_whose_lease_ran_out_mid_call_steps_aside(rig: Rig) -> None:
    """Engine A's send stalls past its lease; engine B takes the reply over (the stalled send
    may land: B's copy is marked); A's late acknowledgement is refused and A reports busy."""
    admission = rig.admit("fk_tg", "takeover", "in-1")
    text = reply_text("A-takeover", "contested.")
    inner = rig.platforms["fk_tg"]
    first = ReplyEngine(rig.ledger, rig.platforms, owner="engine-a", lease_seconds=30)
    second = ReplyEngine(rig.ledger, rig.platforms, owner="engine-b", lease_seconds=30)
    taken_over: list[str] = []

    class Stalling:
        profile = inner.profile

        def send(self, request, body, *, marked):  # type: ignore[no-untyped-def]
            if not taken_over:
                rig.ledger.clock.sleep(31)  # the call outlives A's lease
                reply = rig.ledger.replies.for_inbound(admission.inbound.id)
                assert reply is not None
                taken_over.append(second.deliver(reply.id).status)
            return inner.send(request, body, marked=marked)

        def edit(self, request, message_id, body, *, marked):  # type: ignore[no-untyped-def]
            return inner.edit(request, message_id, body, marked=marked)

        def delete(self, request, message_id):  # type: ignore[no-untyped-def]
            return inner.delete(request, message_id)

    first.platforms["fk_tg"] = Stalling()
    result = first.answer(
        admission.inbound.id,
        text,
        on_commit=lambda tx, t: rig._persist(tx, admission.inbound.id, t),
    )
    assert taken_over == ["delivered"] and result.status == "busy"
    failures = rig.check("fk_tg", "takeover", "A-takeover", admission.inbound.id, "marked_dupes")
    assert not failures, "\n".join(failures)


def test_a_redelivery_with_another_payload_is_flagged_not_processed(rig: Rig) -> None:
    first = rig.ledger.inbound.admit("fk_tg", "bot", "c", "in-1", {"text": "hi"})
    same = rig.ledger.inbound.admit("fk_tg", "bot", "c", "in-1", {"text": "hi"})
    edited = rig.ledger.inbound.admit("fk_tg", "bot", "c", "in-1", {"text": "hi (edited)"})
    assert first.new and not first.payload_changed
    assert not same.new and not same.payload_changed
    assert not edited.new and edited.payload_changed
    assert edited.inbound.payload == {"text": "hi"}  # the admitted message is kept as it was


@pytest.mark.parametrize(
    "option",
    [
        {"inline_wait_max_seconds": float("nan")},
        {"edit_interval_seconds": -1},
        {"lease_seconds": 0},
        {"backoff_cap_seconds": float("inf")},
        # The cap would silently replace the base; a cap past a day would be clamped.
        {"backoff_base_seconds": 10.0, "backoff_cap_seconds": 5.0},
        {"backoff_cap_seconds": MAX_RETRY_SECONDS + 1},
    ],
)
def test_engine_options_are_validated(rig: Rig, option: dict[str, float]) -> None:
    from oncewire import ConfigurationError

    with pytest.raises(ConfigurationError, match="seconds"):
        ReplyEngine(rig.ledger, rig.platforms, **option)


def test_bad_input_is_refused_and_changes_nothing(rig: Rig) -> None:
    from oncewire import ConfigurationError
    from oncewire.errors import InvalidPayload

    with pytest.raises(InvalidPayload):
        rig.ledger.inbound.admit("fk_tg", "bot", "c", "in-1", {"x": float("nan")})
    with pytest.raises(ConfigurationError):
        rig.ledger.inbound.admit("fk_tg", "bot", "", "in-1", {})
    with pytest.raises(ConfigurationError):
        rig.engine.answer(rig.admit("nowhere", "c", "in-2").inbound.id, "text")
    assert [i.platform for i in rig.ledger.inbound.list()] == ["nowhere"]
    assert rig.ledger.replies.list() == []


def test_engines_racing_for_one_reply_deliver_it_once(rig: Rig) -> None:
    """Four engines deliver the same committed reply at once: one message, never a second."""
    for round_number in range(5):
        admission = rig.admit("fk_dc", f"race-{round_number}", "in-1")
        text = reply_text(f"A-race{round_number}", "once. " * 500)  # two chunks on Discord
        profile = rig.platforms["fk_dc"].profile
        reply = rig.ledger.replies.commit(admission.inbound.id, text, profile)
        engines = [ReplyEngine(rig.ledger, rig.platforms, owner=f"e{n}") for n in range(4)]
        barrier = threading.Barrier(len(engines))
        outcomes: list[str] = []

        def run(
            engine: ReplyEngine,
            reply_id: int = reply.id,
            barrier: threading.Barrier = barrier,
            outcomes: list[str] = outcomes,
        ) -> None:
            barrier.wait()
            outcomes.append(engine.deliver(reply_id).status)

        threads = [threading.Thread(target=run, args=(engine,)) for engine in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert set(outcomes) <= {"delivered", "busy"}
        shown = rig.view().visible("fk_dc", f"race-{round_number}")
        if rig.ledger.replies.get(reply.id).state is not ReplyState.DELIVERED:
            rig.engine.deliver(reply.id)  # every racer stepped aside: the next pass finishes
            shown = rig.view().visible("fk_dc", f"race-{round_number}")
        assert len(shown) == 2, [m.text[:30] for m in shown]
        assert not any(profile.strip_marker(m.text)[1] for m in shown)


def test_a_stream_that_fails_leaves_an_open_record_the_next_answer_completes(rig: Rig) -> None:
    admission = rig.admit("fk_tg", "broken", "in-1")
    text = reply_text("A-broken", "answered after a failed stream " * 10)

    def failing() -> Iterator[str]:
        yield text[:40]
        yield text[40:80]
        raise ConnectionError("the model went away")

    with pytest.raises(ConnectionError):
        rig.engine.stream(admission.inbound.id, failing())
    reply = rig.ledger.replies.for_inbound(admission.inbound.id)
    assert reply is not None and reply.state is ReplyState.OPEN and reply.lease_owner is None
    assert all(op.state.value == "acked" for op in rig.ledger.replies.ops(reply.id))
    other = ReplyEngine(rig.ledger, rig.platforms, owner="another", edit_interval_seconds=0.0)
    pieces = [text[i : i + 50] for i in range(0, len(text), 50)]
    other.stream(
        admission.inbound.id,
        pieces,
        on_commit=lambda tx, t: rig._persist(tx, admission.inbound.id, t),
    )
    _only_reply(rig, "fk_tg", "broken", "A-broken", admission.inbound.id)
