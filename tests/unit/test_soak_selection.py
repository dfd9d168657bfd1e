"""The soak selection of tests/conftest.py: a test marked ``slow`` is deselected by default and
collected with ``--soak``, ``ONCEWIRE_SOAK=1`` or ``-m slow``. Each case collects this module in
a child pytest, so what is checked is pytest's own collection, not a flag read back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SOAK_ENV

HERE = Path(__file__)
REPO_ROOT = HERE.parents[2]
SAMPLE = "test_soak_sample_runs_only_in_a_soak_run"


@pytest.mark.slow
def test_soak_sample_runs_only_in_a_soak_run(request: pytest.FixtureRequest) -> None:
    """Collected only in a soak run (the cases below check that it is)."""
    assert request.node.get_closest_marker("slow") is not None


def _collected(*args: str, soak_env: str | None = None) -> tuple[list[str], str]:
    env = {k: v for k, v in os.environ.items() if k != SOAK_ENV}
    if soak_env is not None:
        env[SOAK_ENV] = soak_env
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    ran = subprocess.run(
        [*command, "-p", "no:xdist", *args, str(HERE)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    names = [line.rsplit("::", 1)[-1] for line in ran.stdout.splitlines() if "::" in line]
    return names, ran.stdout


def test_a_default_run_deselects_the_slow_tests_and_says_so() -> None:
    names, output = _collected()
    assert SAMPLE not in names, output
    assert "test_a_default_run_deselects_the_slow_tests_and_says_so" in names, output
    assert "1 deselected" in output, output


@pytest.mark.parametrize(
    ("args", "soak_env"),
    [(("--soak",), None), ((), "1"), (("-m", "slow"), None)],
    ids=["--soak", "ONCEWIRE_SOAK=1", "-m slow"],
)
def test_a_soak_run_collects_the_slow_tests(args: tuple[str, ...], soak_env: str | None) -> None:
    names, output = _collected(*args, soak_env=soak_env)
    assert SAMPLE in names, output
