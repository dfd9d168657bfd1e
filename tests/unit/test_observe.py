"""The observation seam: listeners hear each observation, a failing one changes nothing, and
only a well-formed traceparent is ever handed to the store."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from oncewire.core import observe


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    assert observe.LISTENERS == []
    yield
    observe.set_traceparent_source(None)
    assert observe.LISTENERS == [], "a test left a listener behind"


def test_listeners_hear_observations_until_stopped() -> None:
    heard: list[tuple[str, dict[str, Any]]] = []

    def listener(name: str, attributes: Mapping[str, Any]) -> None:
        heard.append((name, dict(attributes)))

    stop = observe.listen(listener)
    assert [listener] == observe.LISTENERS
    observe.emit("x.y", {"a": 1})
    stop()
    stop()  # twice is harmless
    observe.emit("x.z", {"a": 2})
    assert heard == [("x.y", {"a": 1})]


def test_a_listener_that_raises_is_logged_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[str] = []

    def broken(name: str, attributes: Mapping[str, Any]) -> None:
        raise RuntimeError("boom")

    stops = [observe.listen(broken), observe.listen(lambda name, _: heard.append(name))]
    try:
        with caplog.at_level(logging.ERROR, logger="oncewire.observe"):
            observe.emit("effect.accepted", {})
    finally:
        for stop in stops:
            stop()
    assert heard == ["effect.accepted"]
    assert "boom" in caplog.text


GOOD = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("answer", "read"),
    [
        (GOOD, GOOD),
        (None, None),
        (GOOD.upper(), None),
        ("0af7651916cd43dd8448eb211c80319c", None),
        ("", None),
        (42, None),
        (GOOD + "\n", None),  # a trailing newline would be stored with the effect
        (GOOD + "-extra", None),
    ],
)
def test_only_a_well_formed_traceparent_is_read(answer: Any, read: str | None) -> None:
    observe.set_traceparent_source(lambda: answer)
    assert observe.current_traceparent() == read


def test_no_source_or_a_failing_source_reads_none() -> None:
    assert observe.current_traceparent() is None

    def failing() -> str | None:
        raise RuntimeError("no context")

    observe.set_traceparent_source(failing)
    assert observe.current_traceparent() is None
