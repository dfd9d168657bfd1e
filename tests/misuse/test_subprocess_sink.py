"""SubprocessSink with commands that start children of their own, or say too much, on both
backends: real shell commands, real process groups, real SIGKILL.

Regressions: ``timeout_seconds`` killed the direct child only, then read its pipes without a
timeout while a grandchild held them: a dispatcher blocked 100 s on a 1 s timeout, and the
grandchild did its work after the attempt was recorded timed out. The dispatcher's own
``attempt_timeout`` (``cancel``) left the grandchild running the same way. And all of stdout
was read into memory and stored: a 50 MB stdout became a 50 MB row.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncewire import ConfigurationError, Ledger
from oncewire.core.canonical import loads
from oncewire.core.limits import DEFAULT_MAX_RESULT_BYTES
from oncewire.sinks import SubprocessSink
from tests.contract.conftest import RawDatabase
from tests.misuse.test_dispatch import dispatch_once, wait_for

GRANDCHILD_SLEEP_SECONDS = 4


@pytest.fixture
def ledger(store_url: str) -> Iterator[Ledger]:
    """On the system clock: these tests run real dispatchers, in real time."""
    opened = Ledger(store_url)
    try:
        yield opened
    finally:
        opened.close()


def _gone(pid: int) -> bool:
    """The process is dead (reaped, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _grandchild_script(tmp_path: Path, parent: str) -> tuple[str, Path, Path]:
    """A shell command whose background child (holding stdout and stderr) sleeps, then writes
    a marker file; ``parent`` is what the shell itself does meanwhile."""
    marker, pid_file = tmp_path / "marker", tmp_path / "grandchild.pid"
    script = (
        f"sh -c 'sleep {GRANDCHILD_SLEEP_SECONDS}; echo landed > {marker}' & "
        f"echo $! > {pid_file}; {parent}"
    )
    return script, marker, pid_file


TIMEOUTS: dict[str, dict[str, Any]] = {
    # The sink's own timeout, the shell waiting for its child.
    "sink-timeout": {"sink": 1.0, "dispatcher": None, "parent": "wait", "said": "timed out"},
    # The sink's own timeout, the shell gone at once (exit 0) and its child holding the pipes.
    "sink-timeout-parent-exited": {
        "sink": 1.0,
        "dispatcher": None,
        "parent": "exit 0",
        "said": "timed out",
    },
    # The dispatcher's attempt_timeout: it gives up on the attempt and calls cancel(attempt).
    "dispatcher-timeout": {
        "sink": 120.0,
        "dispatcher": 1.0,
        "parent": "wait",
        "said": "attempt timed out after 1s",
    },
}


@pytest.mark.timeout(60)  # the sanity bound; before the fix a 1 s timeout waited for the child
@pytest.mark.parametrize("case", sorted(TIMEOUTS))
def test_a_timed_out_command_and_everything_it_started_are_killed(
    ledger: Ledger, raw: RawDatabase, tmp_path: Path, case: str
) -> None:
    options = TIMEOUTS[case]
    script, marker, pid_file = _grandchild_script(tmp_path, options["parent"])
    sink = SubprocessSink(["sh", "-c", script], timeout_seconds=options["sink"])
    ledger.accept("k", "send", {})
    started = time.monotonic()
    dispatch_once(ledger, raw, {"send": sink}, ["k"], attempt_timeout=options["dispatcher"])
    # Recorded before the grandchild could have done its work: nothing waited for it.
    assert not marker.exists(), "the attempt was recorded only after the grandchild's work"
    row = raw.effect_row("k")
    assert (row["state"], row["result"], bool(row["maybe_sent"])) == ("uncertain", None, True)
    assert options["said"] in row["last_error"], row["last_error"]
    grandchild = int(pid_file.read_text())
    wait_for(lambda: _gone(grandchild), f"grandchild {grandchild} to be killed", timeout=30)
    # Killed before its sleep ended: the shell that would write the marker (echo is its own
    # builtin) is dead, so the marker can never appear; it must not be there now.
    assert time.monotonic() < started + GRANDCHILD_SLEEP_SECONDS, "killed only after its sleep"
    assert not marker.exists()


def test_a_command_that_exits_in_time_is_read_to_its_end(
    ledger: Ledger, raw: RawDatabase, tmp_path: Path
) -> None:
    script = "cat; echo ' and more'; echo a warning >&2"
    sink = SubprocessSink(["sh", "-c", script], timeout_seconds=30, keep_history=True)
    ledger.accept("k", "send", {"n": 1})
    dispatch_once(ledger, raw, {"send": sink}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["result"]) == ("done", '{"stdout":"{\\"n\\":1} and more\\n"}')
    assert sink.history[0]["stderr"] == "a warning\n"


# -- output is bounded in memory and in the store ---------------------------------------------

EIGHT_MIB = 8 << 20


def _writes(stdout_bytes: int, stderr_bytes: int = 0, code: int = 0) -> list[str]:
    program = (
        f"import sys; sys.stdout.write('x' * {stdout_bytes}); sys.stdout.flush(); "
        f"sys.stderr.write('e' * {stderr_bytes} + '\\nthe last line\\n'); sys.exit({code})"
    )
    return [sys.executable, "-c", program]


def test_stdout_past_max_output_bytes_is_dropped_and_counted(
    ledger: Ledger, raw: RawDatabase
) -> None:
    sink = SubprocessSink(_writes(EIGHT_MIB), max_output_bytes=65536, keep_history=True)
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": sink}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["last_error"]) == ("done", None)
    stored = loads(row["result"])
    assert stored == {"stdout": "x" * 65536, "stdout_cut_bytes": EIGHT_MIB - 65536}
    assert len(sink.history[0]["stderr"]) <= 65536


def test_a_big_stdout_is_done_with_its_result_not_stored(
    ledger: Ledger, raw: RawDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """The defaults: the sink keeps at most max_output_bytes (1 MiB) of stdout, and the
    dispatcher stores at most max_result_bytes (1 MiB) of result: the work happened, so it is
    done, with a WARNING that its result was not stored."""
    sink = SubprocessSink(_writes(EIGHT_MIB), keep_history=True)
    ledger.accept("k", "send", {})
    with caplog.at_level(logging.INFO, logger="oncewire.dispatch"):
        dispatch_once(ledger, raw, {"send": sink}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["result"]) == ("done", None)
    assert row["last_error"].startswith("result not stored: dict: its canonical JSON is ")
    assert f"the limit is {DEFAULT_MAX_RESULT_BYTES}" in row["last_error"]
    response = sink.history[0]["response"]
    assert len(response) <= DEFAULT_MAX_RESULT_BYTES  # what the sink held, not 8 MiB
    lines = [r for r in caplog.records if "key=k " in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]


def test_a_big_stderr_keeps_its_end_for_the_reason(ledger: Ledger, raw: RawDatabase) -> None:
    sink = SubprocessSink(
        _writes(0, stderr_bytes=EIGHT_MIB, code=3), max_output_bytes=4096, keep_history=True
    )
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": sink}, ["k"])
    row = raw.effect_row("k")
    assert (row["state"], row["last_error"]) == ("uncertain", "exit 3: the last line")
    stderr = sink.history[0]["stderr"]
    assert len(stderr) <= 4096 and stderr.endswith("e\nthe last line\n")


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "1024"])
def test_an_invalid_max_output_bytes_is_refused(limit: Any) -> None:
    with pytest.raises(ConfigurationError, match="max_output_bytes"):
        SubprocessSink(["true"], max_output_bytes=limit)


def test_the_sinks_children_are_in_process_groups_of_their_own(
    ledger: Ledger, raw: RawDatabase
) -> None:
    program = "import os; print(os.getpgrp())"
    sink = SubprocessSink([sys.executable, "-c", program], keep_history=True)
    ledger.accept("k", "send", {})
    dispatch_once(ledger, raw, {"send": sink}, ["k"])
    (entry,) = sink.history
    assert entry["response"] == entry["pid"] != os.getpgrp()
