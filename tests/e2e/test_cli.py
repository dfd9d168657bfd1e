"""The real ``oncewire`` console script, run as a child process against real SQLite files.

Bad input must end in one line on stderr that starts with ``error:``, a non-zero exit, no
traceback (unless ``-v`` asks for one), and a store exactly as it was.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import click
import pytest

import oncewire
from oncewire import Ledger, Receipts
from oncewire.cli import cli
from oncewire.storage.records import EffectState, Settlement
from oncewire.testing import ManualClock
from tests.support.claims import settle_and_claim

BIN = Path(sys.executable).parent
ONCEWIRE = shutil.which("oncewire", path=str(BIN)) or shutil.which("oncewire")


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        yield path
        if isinstance(command, click.Group):
            yield from _command_paths(command, path)


COMMAND_PATHS = [(), *_command_paths(cli)]


def _command(path: tuple[str, ...]) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


def run(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    assert ONCEWIRE, "the oncewire console script is not installed next to this Python"
    base = {k: v for k, v in os.environ.items() if not k.startswith("ONCEWIRE_")}
    return subprocess.run(
        [ONCEWIRE, *args],
        env={**base, **(env or {})},
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(*args: str, **kw: Any) -> str:
    result = run(*args, **kw)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def ok_json(*args: str, **kw: Any) -> Any:
    return json.loads(ok(*args, "--json", **kw))


def assert_clean_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode != 0
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stdout == ""


def snapshot(path: Path) -> tuple[bytes, list[str]]:
    """The store's file bytes and its full SQL dump (or just the bytes, if not a database)."""
    data = path.read_bytes()
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            dump = list(conn.iterdump())
        finally:
            conn.close()
    except sqlite3.DatabaseError:
        dump = []
    return data, dump


@pytest.fixture
def store_db(tmp_path: Path) -> Path:
    """A closed store holding one effect in each of three states, and two receipts."""
    path = tmp_path / "store.db"
    clock = ManualClock()
    with Ledger(str(path), clock=clock) as ledger:
        ledger.accept("pending-1", "mail", {"to": "zoë@example.com"})
        ledger.accept("done-1", "charge", {"cents": 1999})
        ledger.accept("cancelled-1", "mail", {"to": "bob@example.com"})
        ledger.effects.cancel("cancelled-1")
        (claim,) = settle_and_claim(
            ledger.store,
            [],
            owner="t",
            now=clock.now(),
            lease_seconds=30,
            limit=1,
            kinds=["charge"],
        )[1]
        settle_and_claim(
            ledger.store,
            [Settlement(claim.id, claim.fence, EffectState.DONE, '{"charge":"ch_1"}')],
            owner="t",
            now=clock.now(),
            lease_seconds=30,
            limit=0,
        )
    # The CLI purges by the real clock: req-old was kept for a minute long ago, req-new for a
    # day from now.
    long_ago = ManualClock(start=1_000_000_000.0)
    with Receipts(str(path), clock=long_ago, retention_seconds=60) as receipts:
        receipts.run_once("req-old", {"n": 1}, lambda tx: {"ticket": 1})
    with Receipts(str(path), retention_seconds=86_400) as receipts:
        receipts.run_once("req-new", {"n": 2}, lambda tx: {"ticket": 2})
    return path


# -- version and help ------------------------------------------------------------------------


def test_version() -> None:
    assert ok("--version").strip() == f"oncewire, version {oncewire.__version__}"


def test_python_dash_m_runs_the_same_cli() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "oncewire", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert oncewire.__version__ in result.stdout


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=lambda p: " ".join(p) or "oncewire")
def test_every_command_has_help_text(path: tuple[str, ...]) -> None:
    command = _command(path)
    summary = (command.help or "").strip()
    assert summary, f"`oncewire {' '.join(path)}` has no help text"
    output = ok(*path, "--help")
    assert output.startswith("Usage: oncewire")
    assert summary.split()[0] in output


def test_the_command_tree_is_what_the_docs_promise() -> None:
    assert {"effects", "receipts"} <= set(cli.commands)
    assert {" ".join(p) for p in COMMAND_PATHS} >= {
        "effects list",
        "effects show",
        "effects accept",
        "effects cancel",
        "effects retry",
        "receipts list",
        "receipts show",
        "receipts purge",
    }


def test_help_names_the_database_environment_variable() -> None:
    assert "ONCEWIRE_DB" in ok("effects", "list", "--help")


# -- effects ---------------------------------------------------------------------------------


def test_effects_accept_list_show_cancel_retry(tmp_path: Path) -> None:
    db = str(tmp_path / "new.db")  # accept creates the store
    accepted = ok_json("effects", "accept", "--db", db, "order-7", "charge", '{"b": 2, "a": 1}')
    assert accepted["key"] == "order-7"
    assert accepted["state"] == "pending"
    assert accepted["payload"] == {"a": 1, "b": 2}

    again = ok_json("effects", "accept", "--db", db, "order-7", "charge", '{"a":1,"b":2}')
    assert again == accepted  # the same key and payload again is a no-op

    listed = ok_json("effects", "list", "--db", db)
    assert [e["key"] for e in listed] == ["order-7"]
    shown = ok_json("effects", "show", "--db", db, "order-7")
    assert shown == {"effect": accepted, "attempts": []}  # nothing dispatched yet

    assert ok("effects", "cancel", "--db", db, "order-7", "--yes").strip() == "order-7: cancelled"
    cancelled = ok_json("effects", "show", "--db", db, "order-7")["effect"]
    assert (cancelled["state"], cancelled["last_error"]) == ("cancelled", "cancelled by operator")

    assert ok("effects", "retry", "--db", db, "order-7", "--yes").strip() == "order-7: pending"
    retried = ok_json("effects", "show", "--db", db, "order-7")["effect"]
    assert (retried["state"], retried["attempts"], retried["last_error"]) == ("pending", 0, None)


def test_accept_options(tmp_path: Path) -> None:
    db = str(tmp_path / "new.db")
    effect = ok_json(
        "effects",
        "accept",
        "--db",
        db,
        "k",
        "mail",
        "{}",
        "--max-attempts",
        "3",
        "--delay",
        "60",
        "--deadline",
        "600",
    )
    assert effect["max_attempts"] == 3
    deadline = dt.datetime.fromisoformat(effect["deadline"])
    not_before = dt.datetime.fromisoformat(effect["not_before"])
    assert (deadline - not_before).total_seconds() == pytest.approx(540)
    assert deadline.utcoffset() == dt.timedelta(0)  # times carry their zone
    assert ok("effects", "accept", "--db", db, "k2", "mail", "[]").strip() == "k2: pending"


def test_effects_list_filters(store_db: Path) -> None:
    db = str(store_db)
    keys = [e["key"] for e in ok_json("effects", "list", "--db", db)]
    assert keys == ["cancelled-1", "done-1", "pending-1"]  # newest first
    by_state = ok_json("effects", "list", "--db", db, "--state", "done", "--state", "cancelled")
    assert [e["key"] for e in by_state] == ["cancelled-1", "done-1"]
    assert [e["key"] for e in ok_json("effects", "list", "--db", db, "--kind", "mail")] == [
        "cancelled-1",
        "pending-1",
    ]
    assert [e["key"] for e in ok_json("effects", "list", "--db", db, "--limit", "1")] == [
        "cancelled-1"
    ]
    shown = ok_json("effects", "show", "--db", db, "done-1")
    done = shown["effect"]
    assert (done["state"], done["result"], done["attempts"]) == ("done", {"charge": "ch_1"}, 1)
    (attempt,) = shown["attempts"]
    assert (attempt["attempt"], attempt["outcome"], attempt["state"]) == (1, "done", "done")


def test_effects_human_output(store_db: Path) -> None:
    table = ok("effects", "list", "--db", str(store_db)).splitlines()
    assert table[0].split() == [
        "ID",
        "KEY",
        "KIND",
        "STATE",
        "ATTEMPTS",
        "RECOVERIES",
        "CREATED",
        "UPDATED",
        "LAST_ERROR",
    ]
    assert [line.split()[1] for line in table[1:-1]] == ["cancelled-1", "done-1", "pending-1"]
    assert table[-1] == "showing 3 of 3"
    shown = ok("effects", "show", "--db", str(store_db), "pending-1")
    assert "key: pending-1" in shown
    assert "zoë@example.com" in shown  # non-ASCII survives the round trip


@pytest.mark.parametrize("command", ["cancel", "retry"])
def test_destructive_effect_commands_ask_first(store_db: Path, command: str) -> None:
    key = "pending-1" if command == "cancel" else "cancelled-1"
    before = snapshot(store_db)
    declined = run("effects", command, "--db", str(store_db), key, stdin="n\n")
    assert declined.returncode != 0
    assert "aborted" in declined.stderr
    assert snapshot(store_db) == before
    accepted = run("effects", command, "--db", str(store_db), key, stdin="y\n")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip().endswith(": cancelled" if command == "cancel" else ": pending")


# -- receipts --------------------------------------------------------------------------------


def test_receipts_list_show_purge(store_db: Path) -> None:
    db = str(store_db)
    listed = ok_json("receipts", "list", "--db", db)
    assert [(r["key"], r["result"]) for r in listed] == [
        ("req-new", {"ticket": 2}),
        ("req-old", {"ticket": 1}),
    ]
    assert [r["key"] for r in ok_json("receipts", "list", "--db", db, "--limit", "1")] == [
        "req-new"
    ]
    assert [r["key"] for r in ok_json("receipts", "list", "--db", db, "--after", "req-new")] == [
        "req-old"
    ]
    shown = ok_json("receipts", "show", "--db", db, "req-old")
    assert (shown["payload"], shown["result"]) == ({"n": 1}, {"ticket": 1})
    table = ok("receipts", "list", "--db", db).splitlines()
    assert table[0].split() == ["KEY", "DIGEST", "RESULT"]
    assert "key: req-new" in ok("receipts", "show", "--db", db, "req-new")

    declined = run("receipts", "purge", "--db", db, stdin="n\n")
    assert declined.returncode != 0
    assert len(ok_json("receipts", "list", "--db", db)) == 2
    assert ok("receipts", "purge", "--db", db, "--yes").strip() == "purged 1 receipt(s)"
    assert [r["key"] for r in ok_json("receipts", "list", "--db", db)] == ["req-new"]


# -- bad input -------------------------------------------------------------------------------

BAD_INPUT = {
    "unknown effect": (
        ["effects", "show", "nope"],
        ["no effect with key 'nope'", "effect_not_found"],
    ),
    "cancel unknown": (["effects", "cancel", "nope", "--yes"], ["effect_not_found"]),
    "retry unknown": (["effects", "retry", "nope", "--yes"], ["effect_not_found"]),
    "unknown receipt": (["receipts", "show", "nope"], ["receipt_not_found"]),
    "malformed payload": (["effects", "accept", "k", "mail", "{bad"], ["malformed JSON"]),
    "NaN payload": (["effects", "accept", "k", "mail", '{"x": NaN}'], ["NaN is not valid JSON"]),
    "Infinity payload": (["effects", "accept", "k", "mail", "[Infinity]"], ["invalid_payload"]),
    "deeply nested payload": (
        ["effects", "accept", "k", "mail", "[" * 5000 + "]" * 5000],
        ["nested too deeply", "invalid_payload"],
    ),
    "overflowing payload": (["effects", "accept", "k", "mail", "1e999"], ["out of range"]),
    "payload conflict": (
        ["effects", "accept", "pending-1", "mail", '{"to": "eve@example.com"}'],
        ["payload_conflict", "nothing was changed"],
    ),
    "cancel a done effect": (["effects", "cancel", "done-1", "--yes"], ["invalid_state"]),
    "retry a pending effect": (["effects", "retry", "pending-1", "--yes"], ["invalid_state"]),
    "NaN deadline": (["effects", "accept", "k", "mail", "{}", "--deadline", "nan"], ["finite"]),
    "infinite delay": (["effects", "accept", "k", "mail", "{}", "--delay", "inf"], ["finite"]),
    "empty kind": (["effects", "accept", "k", "", "{}"], ["configuration_error"]),
    # "Last one wins" would store a payload the operator did not see as typed.
    "duplicate key": (
        ["effects", "accept", "k", "mail", '{"to": "a@example.com", "to": "b@example.com"}'],
        ["duplicate key 'to'", "invalid_payload"],
    ),
    "nested duplicate key": (
        ["effects", "accept", "k", "mail", '{"to": {"cc": 1, "cc": 1}}'],
        ["duplicate key 'cc'"],
    ),
    "missing payload file": (
        ["effects", "accept", "k", "mail", "@/nonexistent/payload.json"],
        ["cannot read the payload", "/nonexistent/payload.json", "configuration_error"],
    ),
}


@pytest.mark.parametrize(("args", "fragments"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_one_error_line_and_changes_nothing(
    store_db: Path, args: list[str], fragments: list[str]
) -> None:
    before = snapshot(store_db)
    group, verb, *rest = args
    assert_clean_error(run(group, verb, "--db", str(store_db), *rest), *fragments)
    assert snapshot(store_db) == before


READERS = [
    ["effects", "list"],
    ["effects", "show", "k"],
    ["effects", "cancel", "k", "--yes"],
    ["effects", "retry", "k", "--yes"],
    ["receipts", "list"],
    ["receipts", "show", "k"],
    ["receipts", "purge", "--yes"],
]


@pytest.mark.parametrize("args", [*READERS, ["effects", "accept", "k", "mail", "{}"]], ids=" ".join)
def test_a_file_that_is_not_a_database_is_refused_untouched(
    tmp_path: Path, args: list[str]
) -> None:
    path = tmp_path / "notes.txt"
    content = b"meeting notes, definitely not SQLite\n" * 100
    path.write_bytes(content)
    group, verb, *rest = args
    assert_clean_error(
        run(group, verb, "--db", str(path), *rest), "not a SQLite database", "store_unusable"
    )
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("args", READERS, ids=" ".join)
def test_readers_never_create_a_missing_database(tmp_path: Path, args: list[str]) -> None:
    missing = tmp_path / "missing.db"
    group, verb, *rest = args
    assert_clean_error(run(group, verb, "--db", str(missing), *rest), "no database at")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["-v", "effects", "show", "--db", "{db}", "nope"],
        ["effects", "-v", "show", "--db", "{db}", "nope"],
        ["effects", "show", "-v", "--db", "{db}", "nope"],
        ["effects", "show", "--db", "{db}", "nope", "--verbose"],
    ],
    ids=["before the group", "after the group", "after the verb", "at the end"],
)
def test_verbose_anywhere_shows_the_traceback(store_db: Path, args: list[str]) -> None:
    result = run(*[a.replace("{db}", str(store_db)) for a in args])
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("error: ")


def test_effects_list_takes_verbose_between_its_options(store_db: Path) -> None:
    listed = json.loads(ok("effects", "list", "-v", "--db", str(store_db), "--json"))
    assert len(listed) == 3


def test_accept_reads_the_payload_from_a_file_or_stdin(tmp_path: Path) -> None:
    db = str(tmp_path / "new.db")
    payload = tmp_path / "payload.json"
    payload.write_text('{"to": "zoë@example.com", "n": [1, 2]}', encoding="utf-8")
    from_file = ok_json("effects", "accept", "--db", db, "by-file", "mail", f"@{payload}")
    assert from_file["payload"] == {"to": "zoë@example.com", "n": [1, 2]}
    from_stdin = ok_json("effects", "accept", "--db", db, "by-stdin", "mail", "-", stdin='{"x": 1}')
    assert from_stdin["payload"] == {"x": 1}
    duplicate = run("effects", "accept", "--db", db, "dup", "mail", "-", stdin='{"x":1,"x":2}')
    assert_clean_error(duplicate, "duplicate key 'x'")
    with closing(sqlite3.connect(db)) as conn:
        stored = conn.execute("SELECT key, payload FROM oncewire_effects ORDER BY id").fetchall()
    assert stored == [
        ("by-file", '{"n":[1,2],"to":"zoë@example.com"}'),
        ("by-stdin", '{"x":1}'),
    ]


def test_an_unexpected_error_is_one_line_without_verbose(tmp_path: Path) -> None:
    # A directory is no database: whatever the driver says, it is one line, no traceback.
    result = run("effects", "list", "--db", str(tmp_path))
    assert_clean_error(result)


def test_a_missing_db_option_is_a_usage_error(tmp_path: Path) -> None:
    result = run("effects", "list")
    assert result.returncode == 2
    assert "--db" in result.stderr
    assert "Traceback" not in result.stderr


# -- the environment -------------------------------------------------------------------------


def test_oncewire_db_is_the_fallback_for_db(tmp_path: Path) -> None:
    env = {"ONCEWIRE_DB": str(tmp_path / "env.db")}
    assert ok("effects", "accept", "from-env", "mail", '{"n": 1}', env=env).strip() == (
        "from-env: pending"
    )
    assert [e["key"] for e in ok_json("effects", "list", env=env)] == ["from-env"]
    assert (tmp_path / "env.db").exists()
    # An explicit --db wins over the environment.
    other = str(tmp_path / "other.db")
    ok("effects", "accept", "--db", other, "explicit", "mail", "{}", env=env)
    assert [e["key"] for e in ok_json("effects", "list", env=env)] == ["from-env"]
    assert [e["key"] for e in ok_json("effects", "list", "--db", other, env=env)] == ["explicit"]
