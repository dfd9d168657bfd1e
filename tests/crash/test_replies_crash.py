"""The replies crash matrix: the application process is killed with a real SIGKILL at each of
the reply engine's crash windows (or while the fake platform parks an operation), restarted on
the same database and journals, and the chat and the database are read directly."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import oncewire.replies  # noqa: F401  (registers the replies crash points)
from oncewire.core import crash
from oncewire.lab.framework import LabContext
from oncewire.lab.suites.replies import CELLS, CrashCell, run_cell
from oncewire.lab.suites.replies_rig import PROFILES, footer, header
from oncewire.testing.fake_platform import ChatView

pytestmark = pytest.mark.crash


def test_every_replies_crash_point_has_a_cell() -> None:
    points = {name for name in crash.registry() if name.startswith("replies.")}
    covered = {cell.kill.partition("@")[0] for cell in CELLS}
    assert points <= covered, f"crash points without a cell: {sorted(points - covered)}"


@pytest.mark.parametrize("cell", CELLS, ids=[cell.cell_id for cell in CELLS])
def test_crash_cell(tmp_path: Path, cell: CrashCell) -> None:
    result = run_cell(LabContext(root=tmp_path, seed=0), cell)
    assert result.passed, "\n".join(result.failures)


def _one_cell(name: str, platform: str, mode: str) -> CrashCell:
    return next(c for c in CELLS if (c.name, c.platform, c.mode) == (name, platform, mode))


def test_seed_gap_streamed_first_send_ack_lost(tmp_path: Path) -> None:
    """A streamed first send carrying the whole reply is accepted, its acknowledgement dies with
    the process: after the restart the platform holds the original and at most one more copy,
    and that copy is marked. Read straight from the journal and the database."""
    cell = _one_cell("sent_ack_lost_streamed_first_send", "fk_tg", "one")
    result = run_cell(LabContext(root=tmp_path, seed=0), cell)
    assert result.passed, "\n".join(result.failures)
    folder = next((tmp_path / "replies").iterdir())
    aid = f"A-{cell.name}-{cell.platform}-{cell.mode}"
    shown = ChatView(sorted(folder.glob("*.jsonl"))).visible("fk_tg")
    marked = [PROFILES["fk_tg"].strip_marker(m.text)[1] for m in shown]
    assert len(shown) == 2 and marked == [False, True]
    assert all(header(aid) in m.text and footer(aid) in m.text for m in shown)
    conn = sqlite3.connect(folder / "caller.sqlite")  # the lab backend's caller store
    try:
        (marked_decision,) = conn.execute("SELECT marked FROM oncewire_replies").fetchone()
        states = conn.execute(
            "SELECT kind, state, marked FROM oncewire_reply_ops ORDER BY seq"
        ).fetchall()
    finally:
        conn.close()
    assert marked_decision == 1
    assert states[0] == ("send", "ambiguous", 0)
    assert ("send", "acked", 1) in states


def test_seed_gap_stream_fully_visible_then_killed(tmp_path: Path) -> None:
    """The preview already shows the whole answer when the process dies, before the final text
    is committed: after the restart there is exactly one message, the recorded preview, edited
    to (and equal to) the committed text; nothing was sent beside it."""
    cell = _one_cell("preview_visible_not_committed", "fk_tg", "many")
    result = run_cell(LabContext(root=tmp_path, seed=0), cell)
    assert result.passed, "\n".join(result.failures)
    folder = next((tmp_path / "replies").iterdir())
    view = ChatView(sorted(folder.glob("*.jsonl")))
    sends = [op for op in view.operations if op["event"] == "send"]
    assert len(sends) == 1, "a second message was sent beside the preview"
    conn = sqlite3.connect(folder / "caller.sqlite")  # the lab backend's caller store
    try:
        (final_text,) = conn.execute("SELECT final_text FROM oncewire_replies").fetchone()
        (persisted,) = conn.execute("SELECT text FROM transcript").fetchone()
    finally:
        conn.close()
    assert view.visible("fk_tg")[0].text == final_text == persisted


@pytest.mark.parametrize("seed", [1, 2])
def test_random_kills(tmp_path: Path, seed: int) -> None:
    """A dozen replies (three platforms, streamed or not, short or long, a few wire faults)
    with the process killed eight times at random replies crash points and hits."""
    from oncewire.lab.suites.replies import run_random_kills

    result = run_random_kills(LabContext(root=tmp_path, seed=seed), count=12, kills=8)
    assert result.passed, "\n".join(result.failures)
    assert result.summary["kills"] >= 4 and result.summary["replies"] == 12


@pytest.mark.parametrize(
    "cell",
    [c for c in CELLS if c.seed_gap and c.platform == "fk_tg" and c.mode != "one"][:2],
    ids=lambda c: c.cell_id,
)
def test_seed_gap_cells_on_postgresql(tmp_path: Path, cell: CrashCell) -> None:
    from oncewire.lab.fixtures import Backend
    from tests.support.pg import server_url

    ctx = LabContext(root=tmp_path, seed=0, backend=Backend("postgresql", server_url()))
    try:
        result = run_cell(ctx, cell)
    finally:
        ctx.cleanup()
    assert result.passed, "\n".join(result.failures)
