"""The lease heartbeat, in real time with short leases: a node that runs several times longer than
its lease without writing keeps its thread (another owner is refused all along, and the fence
never moves); a thread left idle past hold_seconds is let go, and its old holder's next write is
refused; a claimed thread is kept until released; a renewal refused because the fence moved
marks the thread lost. Read from the lease rows directly."""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph

from oncewire.core.errors import ThreadBusy, ThreadLeaseLost
from oncewire.langgraph import OncewireSaver
from oncewire.ledger import Ledger
from oncewire.storage.langgraph import lease_name
from tests.langgraph.conftest import Raw

LEASE = 1.5  # seconds: short, with room for a loaded machine's scheduling delays


class State(TypedDict):
    log: Annotated[list[str], operator.add]


@pytest.fixture
def ledgers(db_url: str) -> Iterator[Callable[[], Ledger]]:
    opened: list[Ledger] = []

    def open_() -> Ledger:
        opened.append(Ledger(db_url))
        return opened[-1]

    yield open_
    for ledger in opened:
        ledger.close()


def _graph(saver: OncewireSaver, slow: Callable[[Any], Any]) -> Any:
    g = StateGraph(State)
    g.add_node("n0", lambda s: {"log": ["n0"]})
    g.add_node("slow", slow)
    g.add_node("n2", lambda s: {"log": ["n2"]})
    g.add_edge(START, "n0")
    g.add_edge("n0", "slow")
    g.add_edge("slow", "n2")
    g.add_edge("n2", END)
    return g.compile(checkpointer=saver)


def _lease(raw: Raw, thread_id: str = "t") -> tuple[str | None, int, float]:
    owner, fence, expires = raw.query(
        "SELECT owner, fence, expires_at FROM oncewire_leases WHERE name = ?",
        (lease_name(thread_id),),
    )[0]
    return owner, int(fence), float(expires)


def _eventually(check: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_node_longer_than_its_lease_keeps_the_thread(
    ledgers: Callable[[], Ledger], raw: Raw
) -> None:
    saver = OncewireSaver(ledgers(), owner="a", lease_seconds=LEASE)
    other = OncewireSaver(ledgers(), owner="b", lease_seconds=LEASE)
    refused: list[str] = []
    seen: list[tuple[str | None, int, float]] = []

    def slow(state: State) -> dict[str, Any]:
        # LangGraph saves the checkpoints before this node in the background: the thread is
        # a's once the first of them has committed its lease.
        _eventually(lambda: bool(raw.query("SELECT 1 FROM oncewire_leases")))
        deadline = time.monotonic() + 3 * LEASE
        while time.monotonic() < deadline:
            with pytest.raises(ThreadBusy) as busy:
                other.claim("t")
            refused.append(str(busy.value.fields.get("owner")))
            seen.append(_lease(raw))
            time.sleep(LEASE / 4)
        return {"log": ["slow"]}

    try:
        result = _graph(saver, slow).invoke({"log": []}, {"configurable": {"thread_id": "t"}})
    finally:
        saver.close()
        other.close()
    assert result["log"] == ["n0", "slow", "n2"]
    assert refused and set(refused) == {"a"}
    assert {(owner, fence) for owner, fence, _ in seen} == {("a", 1)}
    expiries = [expires for _, _, expires in seen]
    assert expiries[-1] > expiries[0] + LEASE  # renewed while the node ran, not by writes


def test_an_idle_thread_is_let_go_and_its_old_holder_refused(
    ledgers: Callable[[], Ledger], raw: Raw
) -> None:
    saver = OncewireSaver(ledgers(), owner="a", lease_seconds=LEASE, hold_seconds=LEASE / 2)
    other = OncewireSaver(ledgers(), owner="b", lease_seconds=30.0)
    app = _graph(saver, lambda s: {"log": ["slow"]})
    config: Any = {"configurable": {"thread_id": "t"}}
    try:
        app.invoke({"log": []}, config)

        def taken() -> bool:
            try:
                other.claim("t")
            except ThreadBusy:
                return False
            return True

        _eventually(taken)
        assert _lease(raw)[:2] == ("b", 2)
        with pytest.raises(ThreadLeaseLost):
            app.update_state(config, {"log": ["late"]})
    finally:
        saver.close()
        other.close()


def test_a_claimed_thread_is_kept_until_released(ledgers: Callable[[], Ledger], raw: Raw) -> None:
    saver = OncewireSaver(ledgers(), owner="a", lease_seconds=LEASE, hold_seconds=0.01)
    other = OncewireSaver(ledgers(), owner="b", lease_seconds=LEASE)
    try:
        saver.claim("t")
        first = _lease(raw)[2]
        time.sleep(2 * LEASE)
        with pytest.raises(ThreadBusy):
            other.claim("t")
        assert _lease(raw)[:2] == ("a", 1) and _lease(raw)[2] > first + LEASE
        assert saver.release("t")
        assert other.claim("t").fence == 2
    finally:
        saver.close()
        other.close()


def test_a_renewal_refused_marks_the_thread_lost(ledgers: Callable[[], Ledger], raw: Raw) -> None:
    ledger = ledgers()
    saver = OncewireSaver(ledger, owner="a", lease_seconds=LEASE)
    try:
        saver.claim("t")
        # Another process takes the thread over (its holder counted as dead, as a resume does).
        taken = ledger.store.acquire_lease(
            lease_name("t"), owner="b", lease_seconds=30.0, now=time.time(), dead_owners=["a"]
        )
        assert taken is not None and taken.fence == 2

        def lost() -> bool:
            try:
                saver.leases.held("t")
            except ThreadLeaseLost:
                return True
            return False

        _eventually(lost)
        assert _lease(raw)[:2] == ("b", 2)  # the refused renewal changed nothing
    finally:
        saver.close()


def test_closing_the_saver_stops_its_heartbeat(ledgers: Callable[[], Ledger], raw: Raw) -> None:
    saver = OncewireSaver(ledgers(), owner="a", lease_seconds=LEASE)
    saver.claim("t")
    beats = [t for t in threading.enumerate() if t.name == "oncewire-langgraph-leases"]
    assert beats
    saver.close()
    for beat in beats:
        beat.join(timeout=5 * LEASE)
    expires = _lease(raw)[2]
    time.sleep(2 * LEASE)
    assert _lease(raw)[2] == expires
