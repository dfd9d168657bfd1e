"""``oncewire effects`` as an operator uses it, on both backends: pages that neither repeat nor
skip, JSON typed by a person taken literally (a key twice is refused, nothing stored), stored
JSON printed as JSON, and every time in ISO 8601 with its zone."""

from __future__ import annotations

import datetime as dt
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from oncewire import Done, Ledger, MaybeSent, Receipts
from oncewire.cli import main
from oncewire.dispatch import Dispatcher
from oncewire.effects.attempt import Attempt
from oncewire.testing import ManualClock
from tests.contract.conftest import RawDatabase

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = cli(capsys, *argv, "--json")
    assert (code, err) == (0, ""), err
    return json.loads(out)


def _keys(out: str) -> list[str]:
    """The KEY column of an effects table (its header and closing line left out)."""
    return [line.split()[1] for line in out.splitlines()[1:-1]]


def test_list_pages_newest_first_to_the_end(
    ledger: Ledger, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(7):
        ledger.accept(f"k{i}", "mail" if i % 2 else "sms", {"i": i})
    ids = {e.key: e.id for e in ledger.effects.list(limit=10)}

    code, out, _ = cli(capsys, "effects", "list", "--db", store_url, "--limit", "3")
    assert code == 0
    assert _keys(out) == ["k6", "k5", "k4"]
    assert out.splitlines()[-1] == f"showing 3 of 7 (next page: --after {ids['k4']})"

    _, out, _ = cli(
        capsys, "effects", "list", "--db", store_url, "--limit", "3", "--after", str(ids["k4"])
    )
    assert _keys(out) == ["k3", "k2", "k1"]
    assert out.splitlines()[-1] == (
        f"showing 3 of 7 after id {ids['k4']} (next page: --after {ids['k1']})"
    )
    _, out, _ = cli(
        capsys, "effects", "list", "--db", store_url, "--limit", "3", "--after", str(ids["k1"])
    )
    assert _keys(out) == ["k0"]
    assert out.splitlines()[-1] == f"showing 1 of 7 after id {ids['k1']}"  # the last page

    # An effect accepted between two pages lands on the first page, never in the middle.
    ledger.accept("k7", "mail", {"i": 7})
    page = cli_json(
        capsys, "effects", "list", "--db", store_url, "--limit", "3", "--after", str(ids["k4"])
    )
    assert [e["key"] for e in page] == ["k3", "k2", "k1"]

    # M counts what the filters match, not the whole table.
    _, out, _ = cli(capsys, "effects", "list", "--db", store_url, "--kind", "mail", "--limit", "2")
    assert _keys(out) == ["k7", "k5"]
    assert out.splitlines()[-1].startswith("showing 2 of 4 (next page: --after ")
    ledger.effects.cancel("k0")
    _, out, _ = cli(capsys, "effects", "list", "--db", store_url, "--state", "cancelled")
    assert _keys(out) == ["k0"]
    assert out.splitlines()[-1] == "showing 1 of 1"


def test_the_default_page_is_fifty(
    ledger: Ledger, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with ledger.transaction() as tx:
        for i in range(55):
            tx.accept(f"k{i:02}", "mail", {})
    _, out, _ = cli(capsys, "effects", "list", "--db", store_url)
    assert len(_keys(out)) == 50
    assert out.splitlines()[-1].startswith("showing 50 of 55 (next page: --after ")


@pytest.mark.parametrize(
    "payload",
    [
        '{"to": "a@example.com", "to": "b@example.com"}',
        '{"order": {"cents": 100, "cents": 1}}',
        '[{"a": 1}, {"b": 1, "b": 1}]',
    ],
    ids=["top level", "nested", "in a list"],
)
def test_a_key_given_twice_is_refused_and_nothing_stored(
    ledger: Ledger,
    store_url: str,
    raw: RawDatabase,
    capsys: pytest.CaptureFixture[str],
    payload: str,
) -> None:
    code, out, err = cli(capsys, "effects", "accept", "--db", store_url, "k", "mail", payload)
    assert code == 1
    assert out == ""
    duplicated = re.findall(r'"(\w+)": [^,}]+, "\1"', payload)[0]
    assert err.startswith(f"error: duplicate key {duplicated!r} in a JSON object")
    assert raw.count("oncewire_effects") == 0


def test_accept_reads_a_file_and_stdin(
    ledger: Ledger,
    store_url: str,
    raw: RawDatabase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "payload.json"
    path.write_text('{"b": [1, 2], "a": "zoë"}', encoding="utf-8")
    assert cli(capsys, "effects", "accept", "--db", store_url, "f", "mail", f"@{path}")[0] == 0
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b'{"n": 1}')))
    assert cli(capsys, "effects", "accept", "--db", store_url, "s", "mail", "-")[0] == 0
    assert raw.effect_row("f")["payload"] == '{"a":"zoë","b":[1,2]}'
    assert raw.effect_row("s")["payload"] == '{"n":1}'


def test_a_kind_mismatch_prints_the_librarys_message(
    ledger: Ledger, store_url: str, raw: RawDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger.accept("k", "mail", {"to": "a"})
    before = raw.effect_row("k")
    with pytest.raises(Exception) as raised:
        ledger.accept("k", "sms", {"to": "a"})
    code, _, err = cli(capsys, "effects", "accept", "--db", store_url, "k", "sms", '{"to": "a"}')
    assert code == 1
    assert err == f"error: {raised.value} [{raised.value.code}]\n"  # type: ignore[attr-defined]
    assert "bound to kind 'mail', not 'sms'" in err
    assert raw.effect_row("k") == before


def _dispatch_twice(ledger: Ledger, clock: ManualClock) -> None:
    """One attempt that may have landed, then one that is done (a redelivery)."""
    calls: list[Attempt] = []

    def sink(attempt: Attempt) -> Any:
        calls.append(attempt)
        if len(calls) == 1:
            return MaybeSent("timed out reading the answer")
        return Done({"ticket": None, "ok": True, "who": "zoë"})

    Dispatcher(ledger, {"mail": sink}).run(until_idle=True)
    assert [c.redelivery for c in calls] == [False, True]


def test_show_prints_json_and_the_attempt_history(
    ledger: Ledger, clock: ManualClock, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger.accept("k", "mail", {"to": "zoë", "cc": None, "urgent": True})
    _dispatch_twice(ledger, clock)

    code, out, _ = cli(capsys, "effects", "show", "--db", store_url, "k")
    assert code == 0
    fields = dict(re.findall(r"^\s*(\w+): ?(.*)$", out.split("\n\n")[0], flags=re.M))
    assert json.loads(fields["payload"]) == {"to": "zoë", "cc": None, "urgent": True}
    assert fields["payload"] == '{"cc": null, "to": "zoë", "urgent": true}'  # JSON, no reprs
    assert fields["result"] == '{"ok": true, "ticket": null, "who": "zoë"}'
    assert ISO.match(fields["created_at"]) and ISO.match(fields["updated_at"])
    history = out.split("\n\n")[1].splitlines()
    assert history[0].split() == [
        "ATTEMPT",
        "FENCE",
        "REDELIVERY",
        "OUTCOME",
        "STATE",
        "MS",
        "STARTED",
        "ERROR",
    ]
    first, second = (line.split() for line in history[1:])
    # attempt, fence, (redelivery), outcome, state, ms, started, error
    assert first[:4] == ["1", "1", "maybe_sent", "uncertain"]
    assert ISO.match(first[5]) and " ".join(first[6:]) == "timed out reading the answer"
    assert second[:5] == ["2", "2", "yes", "done", "done"]
    assert ISO.match(second[6]) and len(second) == 7

    shown = cli_json(capsys, "effects", "show", "--db", store_url, "k")
    assert shown["effect"]["state"] == "done"
    assert shown["effect"]["result"] == {"ok": True, "ticket": None, "who": "zoë"}
    assert [(a["attempt"], a["redelivery"], a["outcome"]) for a in shown["attempts"]] == [
        (1, False, "maybe_sent"),
        (2, True, "done"),
    ]
    for attempt in shown["attempts"]:
        assert ISO.match(attempt["finished_at"]), attempt


def _times(record: dict[str, Any], *names: str) -> None:
    for name in names:
        value = record[name]
        assert value is None or ISO.match(value), (name, value)
        if value is not None:
            assert dt.datetime.fromisoformat(value).utcoffset() == dt.timedelta(0)


def test_every_time_the_cli_prints_is_iso_8601_with_its_zone(
    ledger: Ledger, clock: ManualClock, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger.accept("k", "mail", {"created_at": 12.5}, deadline_seconds=60)
    _dispatch_twice(ledger, clock)
    with Receipts(store_url, clock=clock, retention_seconds=60) as receipts:
        receipts.run_once("r", {"n": 1}, lambda tx: {"ok": True})
    ledger.runs.start("run-1", key="start", scope="s", owner="w", lease_seconds=30)

    (listed,) = cli_json(capsys, "effects", "list", "--db", store_url)
    _times(listed, "created_at", "updated_at", "not_before", "deadline", "lease_expires_at")
    assert listed["payload"] == {"created_at": 12.5}  # the caller's data is left as stored
    accepted = cli_json(capsys, "effects", "accept", "--db", store_url, "k2", "mail", "{}")
    _times(accepted, "created_at", "updated_at", "not_before")
    (receipt,) = cli_json(capsys, "receipts", "list", "--db", store_url)
    _times(receipt, "created_at", "expires_at")
    _times(cli_json(capsys, "receipts", "show", "--db", store_url, "r"), "created_at")
    (run,) = cli_json(capsys, "runs", "list", "--db", store_url)
    _times(run, "updated_at", "lease_expires_at")
    shown = cli_json(capsys, "runs", "show", "--db", store_url, "run-1")
    _times(shown["run"], "created_at", "lease_expires_at")
    for event in shown["events"]:
        _times(event, "at")

    _, table, _ = cli(capsys, "effects", "list", "--db", store_url)
    stamps = re.findall(r"\S*\d{4}-\d\d-\d\d\S*", table)
    assert stamps and all(ISO.match(s) for s in stamps), stamps
    _, shown_text, _ = cli(capsys, "runs", "show", "--db", store_url, "run-1")
    stamps = re.findall(r"\S*\d{4}-\d\d-\d\d\S*", shown_text)
    assert stamps and all(ISO.match(s) for s in stamps), stamps


def test_an_undecodable_stored_payload_is_shown_not_fatal(
    ledger: Ledger, store_url: str, raw: RawDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger.accept("bad", "mail", {"ok": 1})
    ledger.accept("good", "mail", {"ok": 2})
    raw.execute("UPDATE oncewire_effects SET payload = ? WHERE key = ?", ('{"ok": ', "bad"))

    code, out, _ = cli(capsys, "effects", "show", "--db", store_url, "bad")
    assert code == 0
    fields = dict(re.findall(r"^\s*(\w+): ?(.*)$", out.split("\n\n")[0], flags=re.M))
    assert "payload" not in fields  # no "null" that looks like a stored null
    assert fields["payload_error"]
    shown = cli_json(capsys, "effects", "show", "--db", store_url, "bad")
    assert shown["effect"]["payload"] is None and shown["effect"]["payload_error"]
    listed = cli_json(capsys, "effects", "list", "--db", store_url)
    assert [(e["key"], e["payload"]) for e in listed] == [("good", {"ok": 2}), ("bad", None)]
