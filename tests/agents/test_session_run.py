"""A durable run given an OncewireSession: the conversation it leaves is the plain SDK's, and
a run killed anywhere (a real child, SIGKILL) and resumed with the same run_key leaves the
session an uninterrupted run would have, each item once, each tool run once, never diverged.
Read from the stores."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import oncewire
from oncewire import agents as durable
from oncewire.core.canonical import loads
from oncewire.errors import ConfigurationError
from tests.agents import session_scenario as scenario
from tests.support.docs import code_blocks
from tests.support.pg import fresh_schema, server_url

CHILD = "import sys\nfrom tests.agents.session_scenario import main\nsys.exit(main(sys.argv[1:]))"
FINAL = [
    "go: 3 tool results, 1 user turns seen",
    "again: 1 tool results, 2 user turns seen",
]
ASKED_ONCE = Counter({"go:0": 1, "go:2": 1, "go:3": 1, "again:0": 1, "again:1": 1})


def _stored_items(db: str) -> list[Any]:
    """The session's items as the store holds them, in order."""
    ledger = oncewire.Ledger(db)
    try:
        rows = ledger.store.agent_session_items(scenario.SESSION_ID, limit=None)
        return [loads(row.item_json) for row in rows]
    finally:
        ledger.close()


def _plain_history(folder: Path) -> list[Any]:
    folder.mkdir()
    outputs, history = asyncio.run(scenario.plain(folder))
    assert outputs == FINAL
    return history


def _asked(folder: Path) -> Counter[str]:
    return Counter((folder / "calls.log").read_text().split())


@pytest.mark.parametrize("mode", ["sync", "async", "streamed"])
def test_a_conversation_of_durable_runs_leaves_the_plain_sdks_history(
    tmp_path: Path, db: str, mode: str
) -> None:
    # The plain SDK's first: asyncio.run would drop the loop that run_sync leaves open.
    expected = _plain_history(tmp_path / "plain")
    folder = tmp_path / "durable"
    folder.mkdir()
    assert scenario.converse(folder, db, mode) == FINAL
    history = _stored_items(db)
    assert history == expected
    assert len(history) == 12  # per turn: the user's, the calls, their outputs, the answer

    # The same conversation again, run_key by run_key: every step replayed, nothing added.
    assert scenario.converse(folder, db, mode) == FINAL
    assert _stored_items(db) == history
    assert _asked(folder) == ASKED_ONCE


def test_the_session_reads_back_through_the_protocol_as_stored(tmp_path: Path, db: str) -> None:
    folder = tmp_path / "durable"
    folder.mkdir()
    scenario.converse(folder, db, "async")
    ledger = oncewire.Ledger(db)
    try:
        session = durable.OncewireSession(scenario.SESSION_ID, ledger)
        assert asyncio.run(session.get_items()) == _stored_items(db)
        assert asyncio.run(session.get_items(limit=1)) == [_stored_items(db)[-1]]
    finally:
        ledger.close()


def test_a_session_of_another_database_is_refused_before_the_run_starts(tmp_path: Path) -> None:
    folder = tmp_path / "durable"
    folder.mkdir()
    elsewhere = oncewire.Ledger(str(tmp_path / "elsewhere.sqlite"))
    ledger = oncewire.Ledger(str(tmp_path / "caller.sqlite"))
    try:
        session = durable.OncewireSession(scenario.SESSION_ID, elsewhere)
        agent = scenario.build(folder)
        with pytest.raises(ConfigurationError, match="give OncewireSession the run's ledger"):
            durable.run_sync(agent, "go", ledger=ledger, run_key="chat-1", session=session)
        assert not (folder / "calls.log").exists()
    finally:
        ledger.close()
        elsewhere.close()


def test_a_session_on_another_ledger_of_the_same_database_joins_the_run(tmp_path: Path) -> None:
    folder = tmp_path / "durable"
    folder.mkdir()
    db = str(tmp_path / "caller.sqlite")
    other = oncewire.Ledger(db)
    try:
        session = durable.OncewireSession(scenario.SESSION_ID, other)
        agent = scenario.build(folder)
        result = durable.run_sync(agent, "go", ledger=db, run_key="chat-1", session=session)
        assert result.final_output == FINAL[0]
        assert len(_stored_items(db)) == 8
    finally:
        other.close()


def test_a_changed_question_under_the_same_run_key_is_refused_and_adds_nothing(
    tmp_path: Path, db: str
) -> None:
    folder = tmp_path / "durable"
    folder.mkdir()
    assert scenario.converse(folder, db, "async") == FINAL
    before = _stored_items(db)
    ledger = oncewire.Ledger(db)
    try:
        session = durable.OncewireSession(scenario.SESSION_ID, ledger)
        agent = scenario.build(folder)
        with pytest.raises(durable.RunDiverged):
            asyncio.run(
                durable.run(agent, "other", ledger=ledger, run_key="chat-2", session=session)
            )
    finally:
        ledger.close()
    assert _stored_items(db) == before


def _run_child(
    python_child: Any, child_env: Any, folder: Path, db: str, mode: str, **env: str
) -> tuple[int, str, str]:
    args = ("--folder", str(folder), "--db", db, "--mode", mode)
    child = python_child(CHILD, *args, env=child_env(**env), cwd=str(Path(__file__).parents[2]))
    out, err = child.communicate(timeout=120)
    return child.returncode, out, err


@pytest.mark.crash
@pytest.mark.parametrize(
    ("point", "mode", "backend"),
    [
        # The second turn's first step and its input committed; the SDK has not seen it.
        ("agents.step_recorded@4", "sync", "sqlite"),
        # The second turn's tool ended; the SDK has not been given its answer.
        ("agents.tool_settled@4", "async", "postgresql"),
        # The first turn's second tool call ended, streamed.
        ("agents.tool_settled@2", "streamed", "sqlite"),
        # The first turn's final answer recorded; its items not yet in the session.
        ("agents.step_recorded@3", "streamed", "postgresql"),
    ],
)
def test_a_session_run_killed_and_resumed_leaves_each_item_once(
    tmp_path: Path, backend: str, point: str, mode: str, python_child: Any, child_env: Any
) -> None:
    # One backend per cell: each cell costs two child runs.
    if backend == "sqlite":
        _killed_and_resumed(
            tmp_path, str(tmp_path / "caller.sqlite"), point, mode, python_child, child_env
        )
        return
    with fresh_schema(server_url(), "agents") as url:
        _killed_and_resumed(tmp_path, url, point, mode, python_child, child_env)


def _killed_and_resumed(
    tmp_path: Path, db: str, point: str, mode: str, python_child: Any, child_env: Any
) -> None:
    folder = tmp_path / "durable"
    folder.mkdir()
    code, _, err = _run_child(
        python_child,
        child_env,
        folder,
        db,
        mode,
        ONCEWIRE_CRASH=point,
        ONCEWIRE_CRASH_TOKEN=str(tmp_path / "token"),
    )
    assert code == -signal.SIGKILL, err
    expected = _plain_history(tmp_path / "plain")
    # Killed: the session holds a beginning of the uninterrupted history, nothing else.
    killed = _stored_items(db)
    assert killed == expected[: len(killed)]
    code, out, err = _run_child(python_child, child_env, folder, db, mode)
    assert code == 0, err  # a RunDiverged would end the child with an error
    assert json.loads(out.strip().splitlines()[-1])["final_outputs"] == FINAL

    assert _stored_items(db) == expected
    assert _asked(folder) == ASKED_ONCE
    with sqlite3.connect(folder / "receiver.sqlite") as conn:
        tickets = conn.execute(
            "SELECT key, COUNT(*) FROM tickets GROUP BY key ORDER BY key"
        ).fetchall()
    assert tickets == [
        ("agents/chat-1/go-1", 1),
        ("agents/chat-1/go-3", 1),
        ("agents/chat-2/again-1", 1),
    ]


def test_the_documented_session_example_runs_as_shown_and_again(tmp_path: Path) -> None:
    (example,) = [code for code in code_blocks("docs/agents.md") if "OncewireSession" in code]
    for _ in range(2):  # the second time, both turns replay from the record: nothing added
        done = subprocess.run(
            [sys.executable, "-c", example],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n")[:3] == ["Hello!", "Still here.", "4"]
    with sqlite3.connect(tmp_path / "chat.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM oncewire_agent_steps").fetchone() == (2,)
