"""The saver's own crash points for real, on both of its append paths and both backends.

A child process opens an ``OncewireSaver`` on a thread that holds one checkpoint, with one of
``langgraph.put_before_commit``, ``put_after_commit``, ``writes_before_commit`` or
``writes_after_commit`` armed, and puts the thread's second checkpoint (or writes on its first).
On the ``general`` path the child writes without knowing the thread's head (the general append,
whose statements run before ``COMMIT``); on the ``fast`` path it claims the thread and reads its
head first (the one-round-trip append, whose before-commit point is hit before the pipeline is
sent). The other path is made to fail in the child, so a kill proves which path it was on.
After the SIGKILL the tables are read directly: a before-commit kill left nothing of the call
(the head and the newest checkpoint are as before), an after-commit one left the call stored as
the chain's head. Then the call is made again here as a resumed run would make it (a put that
committed is not: the run resumes from it), the chain verifies, and the thread holds the call
once.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.base", reason="needs the langgraph extra")

from langgraph.checkpoint.base import empty_checkpoint

from oncewire import Ledger
from oncewire.langgraph import OncewireSaver
from oncewire.langgraph.chain import verify_thread
from tests.langgraph.conftest import Raw

pytestmark = pytest.mark.crash

THREAD = "crash-thread"
FIRST, SECOND, TASK = "cp-1", "cp-2", "task-1"

CHILD = """
import sys
from langgraph.checkpoint.base import empty_checkpoint
from oncewire import Ledger
from oncewire.langgraph import OncewireSaver

url, path, op = sys.argv[1:4]
saver = OncewireSaver(Ledger(url), heartbeat=False)
other = "lg_append" if path == "fast" else "lg_append_held"

def refuse(*args, **kwargs):
    raise AssertionError(f"{other} was called: not the {path} path")

setattr(saver.store, other, refuse)
if path == "fast":  # the lease held and the head known: the one-round-trip append
    saver.claim("crash-thread")
    assert saver.get_tuple({"configurable": {"thread_id": "crash-thread"}}) is not None
conf = {"thread_id": "crash-thread", "checkpoint_ns": "", "checkpoint_id": "cp-1"}
config = {"configurable": conf}
if op == "put":
    checkpoint = empty_checkpoint()
    checkpoint["id"] = "cp-2"
    saver.put(config, checkpoint, {"source": "update", "step": 1}, {})
else:
    saver.put_writes(config, [("messages", "hello"), ("count", 2)], "task-1")
print("returned", flush=True)
"""

POINTS = [
    ("langgraph.put_before_commit", "put", False),
    ("langgraph.put_after_commit", "put", True),
    ("langgraph.writes_before_commit", "writes", False),
    ("langgraph.writes_after_commit", "writes", True),
]


def _config(checkpoint_id: str | None) -> Any:
    conf: dict[str, Any] = {"thread_id": THREAD, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _put(saver: OncewireSaver, checkpoint_id: str, parent: str | None) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = checkpoint_id
    saver.put(_config(parent), checkpoint, {"source": "update", "step": 1}, {})


def _do(saver: OncewireSaver, op: str) -> None:
    if op == "put":
        _put(saver, SECOND, FIRST)
    else:
        saver.put_writes(_config(FIRST), [("messages", "hello"), ("count", 2)], TASK)


def _head(raw: Raw) -> int:
    rows = raw.query("SELECT head_seq FROM oncewire_lg_threads WHERE thread_id = ?", [THREAD])
    return int(rows[0][0])


def _stored(raw: Raw, op: str) -> list[int]:
    """The chain entries holding the call's rows (one per row)."""
    if op == "put":
        sql = "SELECT seq FROM oncewire_lg_checkpoints WHERE thread_id = ? AND checkpoint_id = ?"
        return [int(r[0]) for r in raw.query(sql, [THREAD, SECOND])]
    sql = (
        "SELECT seq FROM oncewire_lg_writes "
        "WHERE thread_id = ? AND checkpoint_id = ? AND task_id = ?"
    )
    return [int(r[0]) for r in raw.query(sql, [THREAD, FIRST, TASK])]


def _newest(raw: Raw) -> str:
    sql = "SELECT checkpoint_id FROM oncewire_lg_checkpoints WHERE thread_id = ? ORDER BY seq DESC"
    return str(raw.query(sql, [THREAD])[0][0])


@pytest.mark.parametrize("path", ["general", "fast"])
@pytest.mark.parametrize(("point", "op", "committed"), POINTS, ids=[p[0] for p in POINTS])
def test_a_kill_at_a_saver_point_lands_in_its_window_and_the_call_is_redone_once(
    db_url: str,
    raw: Raw,
    python_child: Callable[..., subprocess.Popen[str]],
    child_env: Callable[..., dict[str, str]],
    path: str,
    point: str,
    op: str,
    committed: bool,
) -> None:
    with Ledger(db_url) as ledger:
        saver = OncewireSaver(ledger, heartbeat=False)
        _put(saver, FIRST, None)
        saver.release(THREAD)
        saver.close()
    before = _head(raw)

    child = python_child(CHILD, db_url, path, op, env=child_env(ONCEWIRE_CRASH=point))
    out, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err
    assert "returned" not in out

    stored = _stored(raw, op)
    if committed:
        assert stored and set(stored) == {_head(raw)}, (stored, _head(raw))
        assert _head(raw) == before + 1
    else:
        assert stored == []
        assert _head(raw) == before
        assert _newest(raw) == FIRST

    with Ledger(db_url) as ledger:
        verdict = verify_thread(ledger.store, THREAD, ledger.runs.key)
        assert verdict.ok, verdict.reason
        saver = OncewireSaver(ledger, heartbeat=False)  # the dead child's lease is taken over
        if op == "writes" or not committed:
            # A resumed run makes the call again: writes already stored add nothing; a put
            # that committed is where the run resumes from, not put again.
            _do(saver, op)
        latest = saver.get_tuple(_config(None))
        assert latest is not None
        if op == "put":
            assert latest.checkpoint["id"] == SECOND
        else:
            assert latest.checkpoint["id"] == FIRST
            assert sorted(w[1] for w in latest.pending_writes or []) == ["count", "messages"]
        saver.close()
        assert verify_thread(ledger.store, THREAD, ledger.runs.key).ok
    assert len(_stored(raw, op)) == (1 if op == "put" else 2)
    assert _head(raw) == before + 1
