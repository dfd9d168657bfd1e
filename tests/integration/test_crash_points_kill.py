"""Crash points for real: an armed point SIGKILLs its own process at the chosen hit, a token
file makes it fire once across processes, and an accept that dies before commit leaves nothing."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger

pytestmark = pytest.mark.crash

Child = Callable[..., subprocess.Popen[str]]
Peek = Callable[..., list[tuple[Any, ...]]]

HIT_FIVE_TIMES = """
from oncewire.core import crash
point = crash.register("test.window", "a window under test")
for n in range(1, 6):
    point.hit()
    print(f"survived hit {n}", flush=True)
"""


def test_an_armed_point_kills_the_process_at_the_chosen_hit(
    python_child: Child, child_env: Callable[..., dict[str, str]]
) -> None:
    child = python_child(HIT_FIVE_TIMES, env=child_env(ONCEWIRE_CRASH="test.window@3"))
    out, _ = child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert out.splitlines() == ["survived hit 1", "survived hit 2"]


def test_an_unarmed_or_other_point_does_nothing(
    python_child: Child, child_env: Callable[..., dict[str, str]]
) -> None:
    child = python_child(HIT_FIVE_TIMES, env=child_env(ONCEWIRE_CRASH="test.elsewhere"))
    out, err = child.communicate(timeout=30)
    assert child.returncode == 0, err
    assert len(out.splitlines()) == 5


def test_a_token_makes_a_point_fire_once_across_processes(
    tmp_path: Path, python_child: Child, child_env: Callable[..., dict[str, str]]
) -> None:
    token = tmp_path / "fired"
    env = child_env(ONCEWIRE_CRASH="test.window", ONCEWIRE_CRASH_TOKEN=str(token))
    first = python_child(HIT_FIVE_TIMES, env=env)
    first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL
    assert token.read_text() == f"test.window {first.pid}\n"
    second = python_child(HIT_FIVE_TIMES, env=env)
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert len(out.splitlines()) == 5


ACCEPT = """
import sys
from oncewire import Ledger
with Ledger(sys.argv[1]) as ledger:
    with ledger.transaction() as tx:
        tx.execute("INSERT INTO orders (id) VALUES (1)")
        tx.accept("order-1/charge", "charge", {"order": 1})
print("committed", flush=True)
"""

# Ledger.accept outside a transaction: one autocommit statement, the point hit before it starts.
ACCEPT_ALONE = """
import sys
from oncewire import Ledger
with Ledger(sys.argv[1]) as ledger:
    ledger.accept("order-1/charge", "charge", {"order": 1})
print("committed", flush=True)
"""

# Each form of accept, and the caller's rows it commits with the effect.
ACCEPTS = {"in-a-transaction": (ACCEPT, 1), "alone": (ACCEPT_ALONE, 0)}


@pytest.mark.parametrize("how", sorted(ACCEPTS))
@pytest.mark.parametrize("armed", [True, False], ids=["killed-before-commit", "not-armed"])
def test_an_accept_is_all_or_nothing_across_a_kill(
    db_path: Path,
    python_child: Child,
    child_env: Callable[..., dict[str, str]],
    peek: Peek,
    armed: bool,
    how: str,
) -> None:
    code, rows = ACCEPTS[how]
    with Ledger(str(db_path)) as ledger, ledger.transaction() as tx:
        tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    extra = {"ONCEWIRE_CRASH": "effects.accept_before_commit"} if armed else {}
    child = python_child(code, str(db_path), env=child_env(**extra))
    out, err = child.communicate(timeout=30)
    orders = peek(db_path, "SELECT COUNT(*) FROM orders")[0][0]
    effects = peek(db_path, "SELECT COUNT(*) FROM oncewire_effects")[0][0]
    if armed:
        assert child.returncode == -signal.SIGKILL
        assert (orders, effects, out) == (0, 0, "")
    else:
        assert child.returncode == 0, err
        assert (orders, effects, out) == (rows, 1, "committed\n")
