"""The retry schedule: exponential, capped, jittered downwards; a receiver's wish wins."""

from __future__ import annotations

import math
import random

import pytest

from oncewire import ConfigurationError, RetryPolicy
from oncewire.core.limits import MAX_RETRY_SECONDS


def test_without_jitter_the_delay_doubles_per_attempt() -> None:
    policy = RetryPolicy(base_seconds=0.5, cap_seconds=1000.0, jitter=0.0)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]


def test_the_delay_is_capped() -> None:
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=10.0, jitter=0.0)
    assert [policy.delay(n) for n in (4, 5, 6)] == [8.0, 10.0, 10.0]


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=60.0, jitter=0.0)
    assert policy.delay(10_000) == 60.0


def test_attempt_zero_or_less_counts_as_the_first() -> None:
    policy = RetryPolicy(base_seconds=2.0, jitter=0.0)
    assert policy.delay(0) == policy.delay(-3) == policy.delay(1) == 2.0


def test_jitter_scales_down_within_bounds() -> None:
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=30.0, jitter=0.25, rng=random.Random(7))
    for attempt in range(1, 10):
        raw = min(30.0, 2.0 ** (attempt - 1))
        for _ in range(50):
            assert raw * 0.75 <= policy.delay(attempt) <= raw


def test_jitter_spreads_the_delays() -> None:
    policy = RetryPolicy(base_seconds=1.0, jitter=0.5, rng=random.Random(1))
    delays = {policy.delay(3) for _ in range(20)}
    assert len(delays) > 10


def test_a_seeded_rng_makes_the_schedule_reproducible() -> None:
    first = RetryPolicy(rng=random.Random(42))
    second = RetryPolicy(rng=random.Random(42))
    assert [first.delay(n) for n in range(1, 12)] == [second.delay(n) for n in range(1, 12)]


@pytest.mark.parametrize("retry_after", [0.0, 3.0, 900.0])
def test_retry_after_wins_over_backoff_and_cap(retry_after: float) -> None:
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=60.0, jitter=0.5, rng=random.Random(3))
    assert policy.delay(5, retry_after) == retry_after


def test_an_infinite_cap_means_no_cap_but_the_limit() -> None:
    policy = RetryPolicy(base_seconds=1.0, cap_seconds=math.inf, jitter=0.0)
    assert policy.delay(17) == 2.0**16
    assert policy.delay(18) == policy.delay(10_000) == MAX_RETRY_SECONDS  # a day, not 1.5 days


def test_a_receivers_wish_past_the_limit_is_the_limit() -> None:
    policy = RetryPolicy(base_seconds=1.0, jitter=0.0)
    assert policy.delay(1, MAX_RETRY_SECONDS + 1.0) == MAX_RETRY_SECONDS


def test_a_negative_retry_after_is_ignored() -> None:
    policy = RetryPolicy(base_seconds=1.0, jitter=0.0)
    assert policy.delay(3, -1.0) == 4.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_seconds": -1.0},
        {"base_seconds": math.nan},
        {"base_seconds": math.inf},
        {"cap_seconds": -0.1},
        {"cap_seconds": math.nan},
        {"jitter": -0.1},
        {"jitter": 1.5},
        {"jitter": math.nan},
    ],
    ids=repr,
)
def test_invalid_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


# Regression: RetryPolicy(base_seconds=3600) was silently capped at the default cap_seconds
# (300), so the first retry came after 5 minutes, not an hour.
@pytest.mark.parametrize(
    "options",
    [{"base_seconds": 3600}, {"base_seconds": 10.0, "cap_seconds": 5.0}, {"cap_seconds": 0.1}],
    ids=repr,
)
def test_a_base_above_the_cap_is_refused(options: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="is above cap_seconds") as caught:
        RetryPolicy(**options)  # type: ignore[arg-type]
    policy = RetryPolicy()
    base = options.get("base_seconds", policy.base_seconds)
    cap = options.get("cap_seconds", policy.cap_seconds)
    assert f"base_seconds ({base:g}) is above cap_seconds ({cap:g})" in str(caught.value)


@pytest.mark.parametrize(
    ("base", "cap"), [(3600.0, 3600.0), (3600.0, float("inf")), (0.0, 0.0), (0.5, 300.0)]
)
def test_a_base_at_or_below_the_cap_is_taken_and_is_the_first_delay(
    base: float, cap: float
) -> None:
    assert RetryPolicy(base_seconds=base, cap_seconds=cap, jitter=0.0).delay(1) == base
