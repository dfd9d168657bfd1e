"""A process that only accepts and dispatches loads none of the heavy modules it does not use.

The lab, the tests and the tools an agent starts run oncewire in hundreds of short processes,
and each pays for every module it imports (a few milliseconds each here). The event loop
machinery is loaded only once an ``async def`` sink runs, uuid only where a random id is made
(a delivery, a reconciliation pass), socket not at all (the host name an owner carries is
``os.uname``'s), and the SQL and schema files are read from the package's folder without
``importlib.resources`` (which brings tempfile, shutil and zipfile along).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

NOT_LOADED = ("asyncio", "socket", "uuid", "importlib.resources", "ssl")

ACCEPT_AND_DISPATCH = """
import json, sys
from oncewire import Dispatcher, Ledger
with Ledger(sys.argv[1]) as ledger:
    ledger.accept("k", "note", {"n": 1})
    Dispatcher(ledger, {"note": lambda attempt: None}).run(until_idle=True, handle_signals=False)
    state = ledger.effects.get("k").state
print(json.dumps({"state": str(state), "loaded": sorted(sys.modules)}))
"""

ASYNC_SINK = """
import json, sys
from oncewire import Dispatcher, Ledger
async def note(attempt):
    return None
with Ledger(sys.argv[1]) as ledger:
    ledger.accept("k", "note", {"n": 1})
    Dispatcher(ledger, {"note": note}).run(until_idle=True, handle_signals=False)
    state = ledger.effects.get("k").state
print(json.dumps({"state": str(state), "loaded": sorted(sys.modules)}))
"""


def _run(code: str, db: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, check=True
    ).stdout
    found: dict[str, object] = json.loads(out)
    return found


def test_accepting_and_dispatching_loads_none_of_them(tmp_path: Path) -> None:
    found = _run(ACCEPT_AND_DISPATCH, tmp_path / "app.db")
    assert found["state"] == "done"
    loaded = set(found["loaded"])  # type: ignore[call-overload]
    assert not loaded & set(NOT_LOADED), sorted(loaded & set(NOT_LOADED))


def test_an_async_sink_still_runs_on_its_event_loop(tmp_path: Path) -> None:
    found = _run(ASYNC_SINK, tmp_path / "app.db")
    assert found["state"] == "done"
    assert "asyncio" in found["loaded"]  # type: ignore[operator]
