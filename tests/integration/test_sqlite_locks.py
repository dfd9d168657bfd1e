"""Opening a store never drops the SQLite locks this process already holds on the file.

POSIX record locks belong to a process and an inode: closing any descriptor of the file drops
every lock the process holds on it, those of its open SQLite connections included. SQLite's own
connections share their locks and defer such closes among themselves, but opening a store
read the file's header through a descriptor of its own and closed it. A process that already
had a connection on the file (a first store, the application's own ``sqlite3`` connection)
lost its shared lock by opening a second store; the next process to close its last connection
then took the exclusive lock, checkpointed and deleted the ``-wal`` and ``-shm`` the first
process was still using, and what that process committed afterwards went into a deleted WAL:
lost to every other process, and lost for good if it died before closing.

Each test runs the scenario with real processes: process A keeps a connection on the file and
opens a second store on it; process B opens and closes a connection of its own; A commits and
reads back; a fresh process, while A still runs, finds the ``-wal`` and ``-shm`` in place and
reads what A committed, and so does one after A was killed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

Child = Callable[..., subprocess.Popen[str]]

# Process A: opens the file as the mode says, then answers one JSON line per command read
# from stdin.
PROCESS_A = r"""
import json, sqlite3, sys
from oncewire import Ledger

path, mode = sys.argv[1], sys.argv[2]
ledgers = []
app = None
if mode == "two_ledgers":
    first = Ledger(path)
    ledgers.append(first)
    with first.transaction() as tx:
        tx.accept("before", "note", {"n": 1})
    ledgers.append(Ledger(path))  # a second store on the file this process holds
else:  # the application's own connection, then a ledger on the same file
    app = sqlite3.connect(path, isolation_level=None)
    app.execute("PRAGMA journal_mode = WAL")
    app.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    app.execute("INSERT INTO notes (body) VALUES ('before')")
    ledgers.append(Ledger(path))
    with ledgers[0].transaction() as tx:
        tx.accept("before", "note", {"n": 1})
print(json.dumps({"opened": True}), flush=True)

for line in sys.stdin:
    command = line.strip()
    if command == "write":
        try:
            if app is None:
                with ledgers[0].transaction() as tx:
                    tx.accept("after", "note", {"n": 2})
            else:
                app.execute("BEGIN")
                app.execute("INSERT INTO notes (body) VALUES ('after')")
                ledgers[0].accept_in(app, "after", "note", {"n": 2})
                app.execute("COMMIT")
            seen = ledgers[0].effects.get("after") is not None
            print(json.dumps({"written": True, "seen": seen}), flush=True)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            print(json.dumps({"written": False, "error": error}), flush=True)
"""

# Process B: a connection of its own, opened, used and closed.
PROCESS_B = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=10)
conn.execute("SELECT count(*) FROM oncewire_effects").fetchone()
conn.close()
"""

# The fresh process that checks what is in the file, while A still runs.
VERIFIER = r"""
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=10)
keys = sorted(r[0] for r in conn.execute("SELECT key FROM oncewire_effects"))
notes = []
if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'notes'").fetchone():
    notes = sorted(r[0] for r in conn.execute("SELECT body FROM notes"))
conn.close()
print(json.dumps({"keys": keys, "notes": notes}))
"""


def _answer(process: subprocess.Popen[str]) -> dict[str, Any]:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        _, stderr = process.communicate(timeout=30)
        pytest.fail(f"process A ended early (rc {process.returncode}): {stderr[-2000:]}")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _tell(process: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert process.stdin is not None
    process.stdin.write(command + "\n")
    process.stdin.flush()
    return _answer(process)


def _run(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("mode", ["two_ledgers", "app_connection"])
def test_opening_a_store_keeps_this_process_locks_on_the_file(
    tmp_path: Path, python_child: Child, mode: str
) -> None:
    path = tmp_path / "app.db"
    a = python_child(PROCESS_A, str(path), mode, stdin=subprocess.PIPE)
    assert _answer(a) == {"opened": True}

    _run(PROCESS_B, str(path))  # B's last connection closes while A still uses the file
    beside = {name: Path(f"{path}-{name}").exists() for name in ("wal", "shm")}

    written = _tell(a, "write")
    found = json.loads(_run(VERIFIER, str(path)))  # a fresh process, while A is still open
    a.kill()  # SIGKILL: nothing of A's is checkpointed or closed on its way out
    a.communicate(timeout=30)
    after_kill = json.loads(_run(VERIFIER, str(path)))

    assert {"beside": beside, "written": written, "found": found} == {
        "beside": {"wal": True, "shm": True},  # not deleted under process A
        "written": {"written": True, "seen": True},
        "found": {
            "keys": ["after", "before"],
            "notes": ["after", "before"] if mode == "app_connection" else [],
        },
    }
    assert after_kill == found  # and nothing of it died with process A
