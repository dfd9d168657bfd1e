"""The write-ordering probe: a checkpoint put racing its parent's writes, killed for real.

A graph runs b and c in parallel; b's writes reach the saver HOLD_SECONDS late (the executor
ran that job late), and the process is killed with SIGKILL the instant the checkpoint after
that super-step has been put. With the upstream SqliteSaver that checkpoint is durable while
b's writes on its parent are not: they are lost, and a resume from the parent would run b
again. With OncewireSaver the put waited for b's writes: both are durable. Read from the
tables directly.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from tests.langgraph.conftest import Raw

ROOT = Path(__file__).resolve().parents[2]


def _run_probe(kind: str, db: str, thread_id: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.langgraph.probe_child", kind, db, thread_id],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr[-2000:])


def test_upstream_sqlite_saver_loses_the_parents_writes(tmp_path: Path) -> None:
    db = str(tmp_path / "upstream.db")
    _run_probe("upstream", db, "t")
    conn = sqlite3.connect(db)
    try:
        # The newest durable checkpoint is the one after b and c; its parent is where they ran.
        (newest, parent) = conn.execute(
            "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints WHERE thread_id = 't' "
            "ORDER BY checkpoint_id DESC LIMIT 1"
        ).fetchone()
        assert parent is not None
        logged = [
            JsonPlusSerializer().loads_typed((type_, value))
            for type_, value in conn.execute(
                "SELECT type, value FROM writes WHERE thread_id = 't' AND checkpoint_id = ? "
                "AND channel = 'log'",
                (parent,),
            )
        ]
    finally:
        conn.close()
    assert newest is not None
    # b ran (the checkpoint after it is durable: the probe killed the process once it was put)
    # and its write on the parent is lost. c's may or may not have landed: its job runs
    # beside the put, on a loaded machine after it.
    assert ["b"] not in logged, logged


def test_oncewire_saver_stores_the_parents_writes_first(db_url: str, raw: Raw) -> None:
    _run_probe("oncewire", db_url, "t")
    rows = raw.query(
        "SELECT checkpoint_id, parent_checkpoint_id FROM oncewire_lg_checkpoints "
        "WHERE thread_id = 't' ORDER BY checkpoint_id DESC"
    )
    newest, parent = rows[0]
    assert parent is not None
    paths = {
        r[0]
        for r in raw.query(
            "SELECT task_path FROM oncewire_lg_writes WHERE thread_id = 't' AND checkpoint_id = ?",
            (parent,),
        )
    }
    assert paths == {"~__pregel_pull, b", "~__pregel_pull, c"}
    # And they were stored before the checkpoint: earlier entries of the thread's chain.
    (child_seq,) = raw.query(
        "SELECT seq FROM oncewire_lg_checkpoints WHERE thread_id = 't' AND checkpoint_id = ?",
        (newest,),
    )[0]
    write_seqs = [
        r[0]
        for r in raw.query(
            "SELECT seq FROM oncewire_lg_writes WHERE thread_id = 't' AND checkpoint_id = ?",
            (parent,),
        )
    ]
    assert max(write_seqs) < child_seq
