"""The dashboard's small parts on their own: which hosts count as loopback, which bindings are
refused before anything listens, the action checks, and charts that escape what they draw."""

from __future__ import annotations

import html
import json
import math
import re

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.ui import charts, labview
from oncewire.ui.guard import Guard, Refusal, check_binding, is_loopback
from oncewire.ui.views import age, when
from tests.support.recursion import recursion_limit, stack_depth


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_which_hosts_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_bindings_refused_before_listening() -> None:
    check_binding("127.0.0.1", None)
    check_binding("0.0.0.0", "a-token-of-16-chars")
    with pytest.raises(ConfigurationError, match="without --token"):
        check_binding("0.0.0.0", None)
    with pytest.raises(ConfigurationError, match="at least 16"):
        check_binding("127.0.0.1", "short")


def test_action_checks_in_order() -> None:
    off = Guard(token=None, allow_actions=False)
    with pytest.raises(Refusal, match="actions are off"):
        off.check_action("127.0.0.1:1", None, off.csrf)
    on = Guard(token=None, allow_actions=True)
    on.check_action("127.0.0.1:1", None, on.csrf)
    on.check_action("127.0.0.1:1", "http://127.0.0.1:1", on.csrf)
    with pytest.raises(Refusal, match="another origin"):
        on.check_action("127.0.0.1:1", "http://127.0.0.1:2", on.csrf)
    # The pages send no referrer, so a browser's own POST says Origin: null; Sec-Fetch-Site
    # then tells this origin from another.
    on.check_action("127.0.0.1:1", "null", on.csrf, "same-origin")
    on.check_action("127.0.0.1:1", "null", on.csrf)
    for origin, site in (("null", "cross-site"), (None, "same-site"), ("null", "none")):
        with pytest.raises(Refusal, match="another origin"):
            on.check_action("127.0.0.1:1", origin, on.csrf, site)
    with pytest.raises(Refusal, match="another origin"):
        on.check_action("127.0.0.1:1", "http://127.0.0.1:2", on.csrf, "same-origin")
    with pytest.raises(Refusal, match="CSRF"):
        on.check_action("127.0.0.1:1", None, "")
    with pytest.raises(Refusal, match="CSRF"):
        on.check_action("127.0.0.1:1", None, Guard(token=None, allow_actions=True).csrf)


def test_requests_need_the_token_and_a_loopback_host_name() -> None:
    open_guard = Guard(token=None, allow_actions=False)
    open_guard.check_request("localhost:8765", None, None)
    with pytest.raises(Refusal, match="loopback host names") as refused:
        open_guard.check_request("evil.example:8765", None, None)
    assert refused.value.status == 403
    guarded = Guard(token="t" * 20, allow_actions=False)
    guarded.check_request("evil.example", "t" * 20, None)  # a token server answers any name
    guarded.check_request("evil.example", None, "t" * 20)
    with pytest.raises(Refusal, match="needs its token") as refused:
        guarded.check_request("127.0.0.1", "t" * 19, None)
    assert refused.value.status == 401


def test_ages_read_like_a_person_says_them() -> None:
    assert [age(s) for s in (-5, 0, 59, 60, 423, 3600, 7500, 86400 * 3 + 3600 * 4)] == [
        "0 s", "0 s", "59 s", "1 min 0 s", "7 min 3 s", "1 h 0 min", "2 h 5 min", "3 d 4 h",
    ]  # fmt: skip


def test_a_stored_time_that_is_no_date_is_shown_not_raised() -> None:
    # Regression: OverflowError or ValueError out of the page of an effect parked at 1e300.
    assert when(1_800_000_000.0) == "2027-01-15T08:00:00.000+00:00"
    assert when(None) == ""
    shown = [when(t) for t in (99_999_999_999_999.0, 1e300, -1e300, math.inf, math.nan)]
    assert shown == [
        "99999999999999.0 (not a date)",
        "1e+300 (not a date)",
        "-1e+300 (not a date)",
        "inf (not a date)",
        "nan (not a date)",
    ]
    assert [age(s) for s in (math.inf, -math.inf, math.nan)] == ["?", "?", "?"]


def test_charts_escape_labels_and_carry_their_figures() -> None:
    drawn = str(charts.bars("t", [("<b>x</b>", 3), ("y", 0)], colours={}))
    assert "<b>" not in drawn and "&lt;b&gt;x&lt;/b&gt;" in drawn
    assert 'data-value="3"' in drawn and 'data-value="0"' in drawn
    columns = str(charts.columns("c", ["a", "b"], [charts.Series('"q"', "#000", [1, 2])], every=1))
    totals = re.search(r'data-totals="([^"]*)"', columns)
    assert totals is not None and json.loads(html.unescape(totals.group(1))) == {'"q"': 3}
    marks = str(charts.timeline("w", [(1.0, "m1", "<i>", "acked")], colours={}))
    assert 'data-marks="1"' in marks and "<i>" not in marks


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "is not JSON"),
        (b"[]", "no 'suites' object"),
        (b'{"suites": {}}', "no overall 'passed'"),
        (b'{"suites": {"s": 1}, "passed": true}', "suite 's' has no 'scenarios'"),
        (b'{"suites": {"s": {"scenarios": {"a": {}}}}, "passed": true}', "without a name"),
    ],
)
def test_what_is_not_evidence_is_refused_with_a_reason(raw: bytes, message: str) -> None:
    with pytest.raises(Refusal, match=message) as refused:
        labview.parse(raw, "f.json")
    assert refused.value.status == 400


def test_evidence_nested_too_deeply_is_refused_without_recursing_into_it() -> None:
    def nested(depth: int) -> bytes:  # the file's object is 1 deep, "x" adds the rest
        return (
            b'{"suites": {}, "passed": true, "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"
        )

    assert labview.parse(nested(labview.MAX_DEPTH), "f.json")["passed"] is True
    refused = [nested(labview.MAX_DEPTH + 1), nested(200_000)]
    with recursion_limit(stack_depth() + 60):  # too little for a parser's recursion
        refused.append(nested(5_000))
        for raw in refused:
            with pytest.raises(Refusal, match="nested too deeply: more than 100 levels") as why:
                labview.parse(raw, "f.json")
            assert why.value.status == 400
