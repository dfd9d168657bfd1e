"""A turn's retry settings are refused when they cannot mean what they say, and no model wait is
longer than a day.

``retry_base_seconds`` above ``retry_cap_seconds`` used to be capped without a word (every wait
was the cap), and a model service's ``retry-after`` of years was slept as it was; now the first
is a ConfigurationError naming both values, as ``RetryPolicy`` does for effects, and the second
is a day at most, as every retry's wait in oncewire.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from oncewire.core.errors import ConfigurationError
from oncewire.core.limits import MAX_RETRY_SECONDS
from oncewire.gateway.model_results import ModelRateLimited, ModelUnavailable
from oncewire.gateway.turn import TurnSettings, TurnWorker


def _settings(**changes: Any) -> TurnSettings:
    return TurnSettings(max_retries=3, max_starts=3, resume_note="resumed", **changes)


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"retry_base_seconds": 10.0, "retry_cap_seconds": 5.0}, r"\(10\) is above .* \(5\)"),
        ({"retry_base_seconds": float("nan")}, "retry_base_seconds must be finite"),
        ({"retry_base_seconds": -1.0}, "retry_base_seconds must be finite"),
        ({"retry_cap_seconds": MAX_RETRY_SECONDS + 1.0}, "a day"),
        ({"tool_poll_seconds": 0.0}, "tool_poll_seconds must be positive"),
        ({"lease_seconds": float("inf")}, "lease_seconds must be positive"),
    ],
)
def test_retry_settings_that_cannot_mean_what_they_say_are_refused(
    changes: dict[str, float], said: str
) -> None:
    with pytest.raises(ConfigurationError, match=said):
        _settings(**changes)


def test_the_defaults_and_a_base_equal_to_the_cap_are_accepted() -> None:
    assert _settings().retry_cap_seconds == 30.0
    assert _settings(retry_base_seconds=5.0, retry_cap_seconds=5.0).retry_base_seconds == 5.0


def _backoff(attempt: int, failure: Any, **changes: Any) -> float:
    worker = SimpleNamespace(settings=_settings(**changes))
    return float(TurnWorker._backoff(worker, attempt, failure))  # type: ignore[arg-type]


def test_a_model_services_retry_after_is_waited_for_a_day_at_most() -> None:
    assert _backoff(0, ModelRateLimited("429", retry_after_seconds=7.0)) == 7.0
    assert _backoff(0, ModelRateLimited("429", retry_after_seconds=1e9)) == MAX_RETRY_SECONDS


def test_the_backoff_stays_under_its_cap_however_many_attempts() -> None:
    for attempt in (0, 1, 5, 100, 10_000):
        wait = _backoff(attempt, ModelUnavailable("down"), retry_cap_seconds=30.0)
        assert 0 <= wait <= 30.0
