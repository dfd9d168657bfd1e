"""A process SIGKILLed inside the transaction that holds a step's record, its conversation
items (``add_items_in_tx``) and its tool call's effect leaves none of them; the same step run
again commits all three. Checked in the tables, after the process is gone, on both backends."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Callable

import pytest

from oncewire import Ledger
from oncewire.agents import OncewireSession

pytestmark = pytest.mark.crash

CHILD = """
import sys
from oncewire import Ledger
from oncewire.agents import OncewireSession

url = sys.argv[1]
items = [
    {"role": "user", "content": "charge the card"},
    {"type": "function_call", "call_id": "c1", "name": "charge", "arguments": "{}"},
]
with Ledger(url) as ledger:
    session = OncewireSession("run-1", ledger)
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO run_steps (step, note) VALUES (1, 'model answered')")
        session.add_items_in_tx(tx, items)
        tx.accept("run-1:c1", "charge", {"cents": 500})
print("committed", flush=True)
"""


def _state(db_url: str) -> tuple[int, int, bool]:
    """(steps recorded, conversation items, whether the effect exists)."""
    with Ledger(db_url) as ledger:
        with ledger.transaction() as tx:
            steps = len(tx.execute("SELECT step FROM run_steps").fetchall())
        items = asyncio.run(OncewireSession("run-1", ledger).get_items())
        return steps, len(items), ledger.effects.find("run-1:c1") is not None


def test_a_kill_before_the_commit_leaves_neither_memory_nor_action(
    db_url: str,
    python_child: Callable[..., subprocess.Popen[str]],
    child_env: Callable[..., dict[str, str]],
) -> None:
    with Ledger(db_url) as ledger, ledger.transaction() as tx:
        tx.execute("CREATE TABLE run_steps (step INTEGER PRIMARY KEY, note TEXT NOT NULL)")
    armed = child_env(ONCEWIRE_CRASH="effects.accept_before_commit")
    killed = python_child(CHILD, db_url, env=armed)
    out, err = killed.communicate(timeout=120)
    assert killed.returncode == -signal.SIGKILL, err
    assert "committed" not in out
    assert _state(db_url) == (0, 0, False)  # neither the items nor the step nor the effect

    again = python_child(CHILD, db_url)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert _state(db_url) == (1, 2, True)  # all three, together
