"""``settling.read_value``'s quick path for exact types gives the verdicts of the careful one.

The common answers (None, ``Done``, exact builtin JSON values) are read by their exact type
before any careful check; anything else (a subclass, an outcome class, an awaitable) must still
be read carefully, so the quick path can never record ``done`` for something that is not.
"""

from __future__ import annotations

import enum
import functools
from typing import Any

import pytest

from oncewire import Done, NotSent
from oncewire.dispatch.settling import Label, read_value


class Colour(enum.IntEnum):
    RED = 1


class Loud(dict[str, Any]):
    def items(self) -> Any:  # what json would see through a subclass's own methods
        return [("shout", "LOUD")]


class MyDone(Done):
    pass


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (None, "null"),
        (Done(), "null"),
        (Done(None), "null"),
        (Done({"b": 1, "a": [1, 2.5]}), '{"a":[1,2.5],"b":1}'),
        ({"b": 1, "a": True}, '{"a":true,"b":1}'),
        ([1, "x"], '[1,"x"]'),
        ((1, 2), "[1,2]"),
        ("text", '"text"'),
        (7, "7"),
        (2.5, "2.5"),
        (False, "false"),
        (Colour.RED, "1"),  # a subclass: read carefully, stored as the plain int it is
        (Loud(quiet="q"), '{"quiet":"q"}'),  # the data that was checked, not its items()
        (MyDone("r"), '"r"'),
    ],
)
def test_storable_answers_are_done_with_their_canonical_json(value: Any, stored: str) -> None:
    verdict = read_value(value)
    assert (verdict.label, verdict.result_json, verdict.misuse) == (Label.DONE, stored, False)


@pytest.mark.parametrize(
    "value",
    [float("nan"), {"k": float("inf")}, {1: "non-string key"}, 10**5000, "\ud800"],
    ids=["nan", "inf", "int-key", "huge-int", "lone-surrogate"],
)
def test_an_exact_builtin_that_cannot_be_stored_is_done_without_its_result(value: Any) -> None:
    # The sink ran and answered: done, never a programming error, and never stored as it is.
    verdict = read_value(value)
    assert (verdict.label, verdict.result_json, verdict.misuse) == (Label.DONE, None, False)
    assert verdict.result_error is not None
    assert verdict.result_error.startswith(f"result not stored: {type(value).__name__}: ")


def test_a_done_whose_result_cannot_be_stored_is_done_without_its_result() -> None:
    verdict = read_value(Done(float("nan")))
    assert (verdict.label, verdict.result_json) == (Label.DONE, None)
    assert verdict.result_error is not None and "result not stored" in verdict.result_error


@pytest.mark.parametrize(
    "value",
    [NotSent, Done, ValueError("x"), print, ValueError, dict, lambda: 1, functools.partial(print)],
    ids=["NotSent", "Done", "exception", "print", "ValueError", "dict", "lambda", "partial"],
)
def test_what_is_not_an_outcome_is_never_done(value: Any) -> None:
    verdict = read_value(value)
    assert (verdict.label, verdict.misuse) == (Label.ERROR, True)


def test_a_result_bigger_than_the_limit_is_done_without_it() -> None:
    assert read_value("x" * 8, max_result_bytes=10).result_json == '"xxxxxxxx"'  # 10 bytes
    verdict = read_value("x" * 9, max_result_bytes=10)
    assert (verdict.label, verdict.result_json, verdict.misuse) == (Label.DONE, None, False)
    assert verdict.result_error == (
        "result not stored: str: its canonical JSON is 11 bytes; the limit is 10 (max_result_bytes)"
    )
