"""``--log-format json`` on the commands that run long: every stderr line is one JSON object with
time, level, logger and message, and the attributes it was logged with; real processes."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from oncewire import Ledger
from oncewire.cli.common import when
from oncewire.cli.logformat import JsonFormatter

APP = """
def note(attempt):
    if attempt.payload.get("refuse"):
        from oncewire import Rejected
        return Rejected("refused by the test")
    return {"noted": attempt.key}
SINKS = {"note": note}
"""


def oncewire(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "oncewire", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def json_lines(stderr: str) -> list[dict[str, Any]]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    parsed = [json.loads(line) for line in lines]  # a line that is not JSON fails here
    for line in parsed:
        assert {"time", "level", "logger", "message"} <= set(line), line
    return parsed


@pytest.mark.parametrize("workers", [1, 2])
def test_dispatch_logs_one_json_object_per_line(tmp_path: Path, workers: int) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    db = tmp_path / "app.db"
    with Ledger(str(db)) as ledger:
        ledger.accept("k-ok", "note", {})
        ledger.accept("k-refused", "note", {"refuse": True})
    ran = oncewire(
        "dispatch",
        "--db",
        str(db),
        "--app",
        "myapp:SINKS",
        "--until-idle",
        "--workers",
        str(workers),
        "--log-format",
        "json",
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    lines = json_lines(ran.stderr)
    attempts = {line["key"]: line for line in lines if line["message"].startswith("attempt ")}
    with closing(sqlite3.connect(db)) as conn:
        stored = dict(conn.execute("SELECT key, state FROM oncewire_effects"))
    assert stored == {"k-ok": "done", "k-refused": "rejected"}
    assert {key: line["state"] for key, line in attempts.items()} == stored
    assert attempts["k-ok"]["outcome"] == "done"
    assert attempts["k-ok"]["redelivery"] is False
    assert attempts["k-ok"]["logger"] == "oncewire.dispatch"
    assert attempts["k-ok"]["level"] == "INFO"
    assert any(line["message"].startswith("dispatching note") for line in lines)


def test_the_environment_chooses_json_too_and_text_stays_the_default(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(APP)
    db = tmp_path / "app.db"
    with Ledger(str(db)) as ledger:
        ledger.accept("k1", "note", {})
        ledger.accept("k2", "note", {})
    args = ["dispatch", "--db", str(db), "--app", "myapp:SINKS", "--until-idle"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    text = oncewire(*args, cwd=tmp_path, env=env)
    assert text.returncode == 0, text.stderr
    assert "dispatching note from myapp:SINKS" in text.stderr
    with pytest.raises(ValueError):
        json.loads(text.stderr.splitlines()[0])
    with Ledger(str(db)) as ledger:
        ledger.accept("k3", "note", {})
    ran = oncewire(*args, cwd=tmp_path, env={**env, "ONCEWIRE_LOG_FORMAT": "json"})
    assert ran.returncode == 0, ran.stderr
    assert [line["key"] for line in json_lines(ran.stderr) if "key" in line] == ["k3"]


def test_the_long_running_commands_offer_the_option(tmp_path: Path) -> None:
    for command in (["dispatch"], ["gateway", "run"], ["lab"]):
        shown = oncewire(*command, "--help", cwd=tmp_path)
        assert shown.returncode == 0, shown.stderr
        assert "--log-format [text|json]" in shown.stdout, command
    listed = oncewire("lab", "--list", "--log-format", "json", cwd=tmp_path)
    assert listed.returncode == 0 and listed.stderr == ""
    refused = oncewire("lab", "--list", "--log-format", "xml", cwd=tmp_path)
    assert refused.returncode == 2 and "xml" in refused.stderr


def test_the_formatter_keeps_attributes_exceptions_and_values_json_cannot_hold() -> None:
    record = logging.LogRecord("oncewire.x", logging.ERROR, __file__, 1, "failed %s", ("k",), None)
    record.key = "k"
    record.where = Path("/tmp/x")  # not JSON: written as its repr
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter(when).format(record))
    assert line["message"] == "failed k"
    assert (line["level"], line["logger"], line["key"]) == ("ERROR", "oncewire.x", "k")
    assert line["where"] == repr(Path("/tmp/x"))
    assert line["time"] == when(record.created)
    assert "RuntimeError: boom" in line["exception"]
    assert "\n" not in JsonFormatter(when).format(record)
