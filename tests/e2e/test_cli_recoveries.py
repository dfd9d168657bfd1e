"""The CLI shows an effect's recoveries: the times its dispatcher died while its sink ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from oncewire import Ledger
from oncewire.testing import ManualClock


def ok(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    result = subprocess.run(
        [sys.executable, "-m", "oncewire", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")
    return result.stdout


def ok_json(*args: str) -> Any:
    return json.loads(ok(*args, "--json"))


def test_effects_list_and_show_print_the_recoveries(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    clock = ManualClock()
    with Ledger(str(path), clock=clock) as ledger:
        ledger.accept("crashed", "mail", {"n": 1})
        ledger.accept("held", "mail", {"n": 2})
        # A dispatcher claims both, records only the first as starting, and dies.
        ledger.store.dispatch_step(
            [], owner="gone", now=clock.now(), lease_seconds=30, limit=2, mark=1
        )
        assert ledger.store.release_claims(now=clock.now(), dead_owners=["gone"]) == 2
    rows = {
        line.split()[1]: line.split()
        for line in ok("effects", "list", "--db", str(path)).splitlines()[1:-1]
    }
    assert rows["crashed"][3:6] == ["uncertain", "0/10", "1"]
    assert rows["held"][3:6] == ["pending", "0/10", "0"]
    shown = ok_json("effects", "show", "--db", str(path), "crashed")
    assert (shown["effect"]["recoveries"], shown["effect"]["maybe_sent"]) == (1, True)
    assert [a["outcome"] for a in shown["attempts"]] == ["owner_died"]
    held = ok_json("effects", "show", "--db", str(path), "held")
    assert (held["effect"]["recoveries"], held["effect"]["maybe_sent"]) == (0, False)
    assert [a["outcome"] for a in held["attempts"]] == ["not_started"]
    text = ok("effects", "show", "--db", str(path), "crashed")
    assert "recoveries: 1" in text
